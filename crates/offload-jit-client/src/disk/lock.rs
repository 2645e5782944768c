//! One compile per key across processes: a lock file per key, made by rename, naming its
//! holder (machine, PID namespace, PID, start time) and kept fresh by a heartbeat thread; a
//! lock whose holder is gone, or that has not been refreshed for the stale time, is broken.

use super::*;

/// This process as a lock holder: machine (boot id), PID namespace, PID and start time.
pub(super) fn holder_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let pid = std::process::id();
    format!("{boot}\n{ns}\n{pid}\n{}", start_time(pid).unwrap_or(0))
}

/// A process's start time (field 22 of `/proc/PID/stat`).
pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the holder described by a lock's contents is known to be gone (it ran on this
/// machine, in this PID namespace, and that process no longer exists).
pub(super) fn holder_is_gone(contents: &str) -> bool {
    let mut lines = contents.lines();
    if lines.next() != Some(LOCK_MAGIC) {
        return false;
    }
    let mine = holder_identity();
    let mut me = mine.lines();
    let (Some(boot), Some(ns)) = (lines.next(), lines.next()) else {
        return false;
    };
    if Some(boot) != me.next() || Some(ns) != me.next() || boot.is_empty() {
        return false;
    }
    let (Some(Ok(pid)), Some(Ok(start))) = (
        lines.next().map(str::parse::<u32>),
        lines.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    start_time(pid) != Some(start)
}

/// A held lock: refreshed by a thread until dropped, then removed (if still ours).
pub(super) struct LockGuard {
    path: PathBuf,
    ino: u64,
    stop: Arc<(Mutex<bool>, Condvar)>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.stop;
            *offload_core::sync::lock(lock) = true;
            cv.notify_all();
        }
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        // Someone may have broken the lock (this process stalled past STALE_AFTER) and made
        // their own: only ours is removed.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(super) enum TryLock {
    Held(LockGuard),
    /// Someone holds it: the lock's inode and modification time, and its contents.
    Busy(u64, i64, i64, String),
    /// It was removed between the attempt and the look: try again.
    Gone,
}

impl DiskCache {
    pub(super) fn try_lock(&self, key: &CacheKey) -> std::io::Result<TryLock> {
        let path = self.lock_path(key);
        let tmp = tmp_name(self.dir(), &format!("{}{LOCK_EXT}", key.hex()));
        let mut f = create_private(&tmp)?;
        let written = f.write_all(format!("{LOCK_MAGIC}\n{}\n", holder_identity()).as_bytes());
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                let ino = f.metadata()?.ino();
                let stop = Arc::new((Mutex::new(false), Condvar::new()));
                let heartbeat = {
                    let stop = stop.clone();
                    let every = self.stale_after / 10;
                    std::thread::Builder::new()
                        .name("offload-cache-lock".into())
                        .spawn(move || heartbeat(f, &stop, every))
                        .ok()
                };
                Ok(TryLock::Held(LockGuard {
                    path,
                    ino,
                    stop,
                    heartbeat,
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match std::fs::symlink_metadata(&path) {
                    Ok(m) => {
                        let contents = std::fs::read_to_string(&path).unwrap_or_default();
                        Ok(TryLock::Busy(m.ino(), m.mtime(), m.mtime_nsec(), contents))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TryLock::Gone),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Removes the stale lock of `key` that had inode `ino` (and puts back a fresh one that
    /// another process made in the meantime).
    pub(super) fn break_lock(&self, key: &CacheKey, ino: u64) {
        let path = self.lock_path(key);
        let aside = tmp_name(self.dir(), &format!("{}.stale", key.hex()));
        if std::fs::rename(&path, &aside).is_err() {
            return; // gone already
        }
        if std::fs::symlink_metadata(&aside).is_ok_and(|m| m.ino() != ino) {
            // Not the stale one: someone's fresh lock. Put it back unless there is another.
            let _ = std::fs::hard_link(&aside, &path);
        } else {
            self.count(|s| s.locks_broken += 1);
        }
        let _ = std::fs::remove_file(&aside);
    }
}

pub(super) fn heartbeat(f: File, stop: &(Mutex<bool>, Condvar), every: Duration) {
    use std::os::fd::AsRawFd;
    let (lock, cv) = stop;
    let mut done = offload_core::sync::lock(lock);
    while !*done {
        let (d, timed_out) = offload_core::sync::wait_timeout(cv, done, every);
        done = d;
        if timed_out && !*done {
            let now = [libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            }; 2];
            // SAFETY: our descriptor and two valid timespecs.
            unsafe { libc::futimens(f.as_raw_fd(), now.as_ptr()) };
        }
    }
}
