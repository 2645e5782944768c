//! The JIT's disk cache: compiled images kept across processes, shared by the processes of a
//! machine and by the nodes of a cluster that mount one directory.
//!
//! - **Looked up first.** The client asks the disk before it starts a JIT worker, so a process
//!   whose images are all cached never starts one and never maps LLVM.
//! - **Keys.** An entry's key is the in-memory key (image, target, options, post-processing)
//!   hashed with the *toolchain identity* (`JitClient`'s: the worker executable's contents, the
//!   LLVM library it loads, the linker or `ptxas` that post-processes) and [`SCHEMA`]; all of it
//!   is computed without loading LLVM.
//! - **Entries check themselves.** One file per entry, `<key hex>.entry`: magic, schema, the
//!   full key, a label, the payload's length, the payload, and a BLAKE3 digest of all that. It
//!   is written to a private temporary file in the same directory and renamed into place, so a
//!   reader sees the whole entry or none. An entry that is truncated, corrupt, of another key or
//!   of another schema is a miss with one warning, is removed, and the image is compiled again.
//! - **One compile across processes.** A process that misses takes the key's lock file
//!   (`<key hex>.lock`, made by `link(2)`ing a complete temporary file to the name, which is
//!   atomic on local filesystems and NFS alike) before compiling; the others wait for the entry
//!   to appear. The holder refreshes the lock's modification time every few seconds; a lock
//!   that has not changed for [`STALE_AFTER`] (or whose holder is gone, when it ran on this
//!   machine) is broken, so a killed compiler never blocks the others.
//! - **Bounded.** Past the size cap, entries are deleted least recently used first down to 90 %
//!   of the cap. Recency is the entry's modification time, which the cache sets itself when an
//!   entry is used (at most every [`STAMP_EVERY`]), not the access time, which `noatime` and
//!   `relatime` mounts do not keep. Pruning runs after writes, at most once a minute per
//!   directory (or sooner when this process wrote a sixteenth of the cap), and deletes only
//!   files whose names and magic say the cache wrote them.
//! - **Never fails a compile.** An unusable directory, a full disk or a permission error is one
//!   warning; the compile goes on without the disk.
//! - **Trusted directories only.** The directory is created with mode 0700. Entries are
//!   executable code, so they are not loaded from a directory that is group- or
//!   world-writable or owned by another user, unless `OFFLOAD_CACHE_TRUST=1` says so (a shared,
//!   pre-populated cache, best used with `OFFLOAD_CACHE=read-only`).
//!
//! What is assumed of a shared filesystem: `rename(2)` within a directory and `link(2)` are
//! atomic, and a file's modification time can be set by its owner. Not assumed: `flock`/`fcntl`
//! locks, access times, or clocks agreeing between nodes (staleness is judged by a lock's
//! modification time *changing*, measured on the waiter's own clock). A reader on another NFS
//! client may lose an entry that is pruned while it reads (`ESTALE`): that is a miss, never a
//! wrong image.

use crate::config::{DiskConfig, DiskMode};
use offload_core::jit::wire::{Reader, Writer};
use offload_core::jit::{CacheKey, CompileOutput, decode_signatures, encode_signatures};
use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// The entry format's version: part of every key and of every entry.
pub const SCHEMA: u32 = 1;
/// First bytes of every entry.
pub const MAGIC: &[u8; 8] = b"OFLDJITC";
/// Bytes before the payload: magic, schema, key, payload length.
pub const HEADER: usize = 8 + 4 + 32 + 8;
/// Bytes after the payload: the digest.
pub const TRAILER: usize = 32;
/// A lock whose modification time has not changed for this long is broken; its holder
/// refreshes it every tenth of this.
pub const STALE_AFTER: Duration = Duration::from_secs(30);
/// An entry's recency stamp is refreshed when it is used and older than this.
pub const STAMP_EVERY: Duration = Duration::from_secs(10);
/// Automatic pruning runs at most this often per directory.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Temporary files and locks older than this are left by killed processes and removed.
const LEFTOVER_AFTER: Duration = Duration::from_secs(3600);
/// Largest entry read (larger files are not entries this cache wrote).
const MAX_ENTRY: u64 = 1 << 34;

const ENTRY_EXT: &str = ".entry";
const LOCK_EXT: &str = ".lock";
const TMP_PREFIX: &str = ".tmp-";
const PRUNE_STAMP: &str = "prune.stamp";
const LOCK_MAGIC: &str = "offload-jit-lock 1";

/// What the cache has done in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Lookups that found a valid entry.
    pub hits: u64,
    /// Lookups that found none (bad entries included).
    pub misses: u64,
    /// Entries written.
    pub writes: u64,
    /// Bad entries found (and removed).
    pub bad_entries: u64,
    /// Times this process waited for another process's compile of the same key.
    pub lock_waits: u64,
    /// Stale locks broken.
    pub locks_broken: u64,
    /// Entries deleted by pruning.
    pub pruned: u64,
    /// Failed reads, writes or directory operations (each also a warning).
    pub errors: u64,
}

/// One entry, as `offload cache list` shows it.
#[derive(Debug, Clone)]
pub struct EntryInfo {
    /// The file.
    pub path: PathBuf,
    /// Its key (from its name).
    pub key: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was last used (its recency stamp).
    pub last_used: SystemTime,
    /// What it holds (target, post-processing, input size), or why it is not valid.
    pub label: std::result::Result<String, String>,
}

/// The directory's contents, as `offload cache stats` shows them.
#[derive(Debug, Clone, Default)]
pub struct DirSummary {
    /// Entries.
    pub entries: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Lock files (compiles in progress, or left by killed processes).
    pub locks: u64,
    /// Temporary files (writes in progress, or left by killed processes).
    pub temporaries: u64,
    /// Files the cache did not write (left alone).
    pub others: u64,
}

/// The directory's files counted by name ([`DiskCache::count_by_name`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NameCount {
    /// Files named like entries.
    pub entries: u64,
    /// Files named like lock files.
    pub locks: u64,
    /// Files named like temporary files.
    pub temporaries: u64,
}

/// What a prune did.
#[derive(Debug, Clone, Copy, Default)]
pub struct PruneReport {
    /// Entries deleted.
    pub deleted: u64,
    /// Their bytes.
    pub freed: u64,
    /// Leftover temporary and lock files removed.
    pub leftovers: u64,
    /// Bytes of entries left.
    pub bytes_left: u64,
    /// Entries left.
    pub entries_left: u64,
}

/// How the directory turned out when first used.
#[derive(Debug, Clone)]
enum DirState {
    Usable,
    /// Not used; the reason (already warned about).
    Unusable(String),
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn tmp_name(dir: &Path, what: &str) -> PathBuf {
    dir.join(format!(
        "{TMP_PREFIX}{what}.{}.{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Creates `path`, which must not exist (nor be a link), for writing by its owner only.
fn create_private(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Writes `bytes` to a private temporary file next to `path` and renames it into place.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = tmp_name(dir, name);
    let result = (|| {
        let mut f = create_private(&tmp)?;
        f.write_all(bytes)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

mod entry;
mod lock;
mod prune;

pub use entry::{decode_entry, digest, encode_entry};
use lock::*;

fn is_hex_key(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The disk cache of one directory (see the module docs).
#[derive(Debug)]
pub struct DiskCache {
    config: DiskConfig,
    state: OnceLock<DirState>,
    stats: Mutex<DiskStats>,
    warned: Mutex<HashSet<String>>,
    written_since_prune: AtomicU64,
    stale_after: Duration,
}

impl DiskCache {
    /// A cache with these settings (nothing is touched until first used).
    pub fn new(config: DiskConfig) -> Self {
        DiskCache {
            config,
            state: OnceLock::new(),
            stats: Mutex::default(),
            warned: Mutex::default(),
            written_since_prune: AtomicU64::new(0),
            stale_after: STALE_AFTER,
        }
    }

    /// The same with another staleness time for locks (and a heartbeat of a tenth of it); for
    /// tests, which cannot wait [`STALE_AFTER`].
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// Its settings.
    pub fn config(&self) -> &DiskConfig {
        &self.config
    }

    /// Counters of this process.
    pub fn stats(&self) -> DiskStats {
        *offload_core::sync::lock(&self.stats)
    }

    fn count(&self, f: impl FnOnce(&mut DiskStats)) {
        f(&mut offload_core::sync::lock(&self.stats));
    }

    /// Prints `message` on stderr once per process per `topic`.
    fn warn(&self, topic: &str, message: &str) {
        if offload_core::sync::lock(&self.warned).insert(topic.to_string()) {
            eprintln!("offload: warning: JIT disk cache: {message}");
        }
    }

    fn error(&self, topic: &str, message: &str) {
        self.count(|s| s.errors += 1);
        self.warn(topic, message);
    }

    fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Whether the directory is used; the first call creates it (mode 0700) and checks who may
    /// write it.
    pub fn usable(&self) -> std::result::Result<(), String> {
        let state = self.state.get_or_init(|| {
            if self.config.mode == DiskMode::Off {
                return DirState::Unusable(
                    self.config
                        .note
                        .clone()
                        .unwrap_or_else(|| "off (OFFLOAD_CACHE=0)".into()),
                );
            }
            match self.open_dir() {
                Ok(()) => DirState::Usable,
                Err(reason) => {
                    self.error("dir", &format!("not used: {reason}"));
                    DirState::Unusable(reason)
                }
            }
        });
        match state {
            DirState::Usable => Ok(()),
            DirState::Unusable(r) => Err(r.clone()),
        }
    }

    fn open_dir(&self) -> std::result::Result<(), String> {
        let dir = self.dir();
        let shown = dir.display();
        if !dir.exists() && self.config.mode == DiskMode::ReadWrite {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create '{shown}': {e}"))?;
        }
        let m = std::fs::metadata(dir).map_err(|e| format!("'{shown}': {e}"))?;
        if !m.is_dir() {
            return Err(format!("'{shown}' is not a directory"));
        }
        if self.config.trust {
            return Ok(());
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let why = if m.uid() != me {
            Some(format!(
                "it is owned by user {} (this process runs as {me})",
                m.uid()
            ))
        } else if m.mode() & 0o022 != 0 {
            Some(format!(
                "it is writable by {} (mode {:04o})",
                if m.mode() & 0o002 != 0 {
                    "everyone"
                } else {
                    "its group"
                },
                m.mode() & 0o7777
            ))
        } else {
            None
        };
        match why {
            Some(why) => Err(format!(
                "'{shown}': {why}; entries there could be code planted by someone else, so none \
                 is loaded (set OFFLOAD_CACHE_TRUST=1 to trust it, for a shared cache)"
            )),
            None => Ok(()),
        }
    }

    fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir().join(format!("{}{ENTRY_EXT}", key.hex()))
    }

    fn lock_path(&self, key: &CacheKey) -> PathBuf {
        self.dir().join(format!("{}{LOCK_EXT}", key.hex()))
    }

    /// Looks `key` up. A bad entry is a miss with one warning, and is removed.
    pub fn get(&self, key: &CacheKey) -> Option<CompileOutput> {
        self.usable().ok()?;
        let path = self.entry_path(key);
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.count(|s| s.misses += 1);
                return None;
            }
            Err(e) => {
                self.count(|s| s.misses += 1);
                self.error(
                    &format!("read {}", key.hex()),
                    &format!("cannot read '{}': {e}; compiling instead", path.display()),
                );
                return None;
            }
        };
        let result = (|| {
            let m = file.metadata().map_err(|e| e.to_string())?;
            if !m.is_file() {
                return Err("not a regular file".to_string());
            }
            if m.len() > MAX_ENTRY {
                return Err(format!("{} bytes, larger than any entry", m.len()));
            }
            let mut bytes = Vec::new();
            (&file)
                .take(MAX_ENTRY + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("reading: {e}"))?;
            let (_, out) = decode_entry(key, &bytes)?;
            Ok((out, m))
        })();
        match result {
            Ok((out, m)) => {
                self.count(|s| s.hits += 1);
                self.stamp(&file, &m);
                Some(out)
            }
            Err(why) => {
                self.count(|s| {
                    s.misses += 1;
                    s.bad_entries += 1;
                });
                let removed = self.config.mode == DiskMode::ReadWrite
                    && file.metadata().is_ok_and(|mine| {
                        // Only the file read is removed, not a good entry written since.
                        std::fs::symlink_metadata(&path).is_ok_and(|now| now.ino() == mine.ino())
                            && std::fs::remove_file(&path).is_ok()
                    });
                self.warn(
                    &format!("bad {}", key.hex()),
                    &format!(
                        "entry '{}' is bad: {why}; {}compiling again",
                        path.display(),
                        if removed { "removed, " } else { "" }
                    ),
                );
                None
            }
        }
    }

    /// Marks an entry as used now (its modification time), if it was not lately.
    fn stamp(&self, file: &File, m: &std::fs::Metadata) {
        if self.config.mode != DiskMode::ReadWrite {
            return;
        }
        let when = SystemTime::UNIX_EPOCH + Duration::new(m.mtime().max(0) as u64, 0);
        if SystemTime::now()
            .duration_since(when)
            .is_ok_and(|age| age < STAMP_EVERY)
        {
            return;
        }
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
        ];
        use std::os::fd::AsRawFd;
        // SAFETY: a descriptor we own and two valid timespecs. Best effort: a stamp that
        // cannot be set only makes the entry look older.
        unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) };
    }

    /// Stores `out` under `key` (nothing in read-only mode; failures are warnings).
    pub fn put(&self, key: &CacheKey, label: &str, out: &CompileOutput) {
        if self.config.mode != DiskMode::ReadWrite || self.usable().is_err() {
            return;
        }
        let bytes = encode_entry(key, label, out);
        match write_atomically(&self.entry_path(key), &bytes) {
            Ok(()) => {
                self.count(|s| s.writes += 1);
                tracing::info!(target: "offload::jit", "disk cache: stored {} ({} bytes)", key.short(), bytes.len());
                let written = self
                    .written_since_prune
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed)
                    + bytes.len() as u64;
                self.maybe_prune(written);
            }
            Err(e) => self.error(
                "write",
                &format!(
                    "cannot write an entry in '{}': {e}; compiles go on without storing",
                    self.dir().display()
                ),
            ),
        }
    }

    /// Returns the image for `key`: from the disk, or from another process's compile of it
    /// (waited for), or from `compile` (run with the key's lock held, then stored). The flag
    /// says whether it came from the disk.
    pub fn get_or_compile<E>(
        &self,
        key: &CacheKey,
        label: &str,
        compile: impl FnOnce() -> std::result::Result<CompileOutput, E>,
    ) -> std::result::Result<(CompileOutput, bool), E> {
        if let Some(out) = self.get(key) {
            return Ok((out, true));
        }
        if self.config.mode != DiskMode::ReadWrite || self.usable().is_err() {
            return compile().map(|o| (o, false));
        }
        let mut waited = false;
        let mut seen: Option<(u64, i64, i64, Instant)> = None;
        let mut pause = Duration::from_millis(2);
        loop {
            match self.try_lock(key) {
                Ok(TryLock::Held(guard)) => {
                    // Another process may have stored it (and dropped its lock) since the
                    // first look.
                    if let Some(out) = self.get_quiet(key) {
                        return Ok((out, true));
                    }
                    let out = compile()?;
                    self.put(key, label, &out);
                    drop(guard);
                    return Ok((out, false));
                }
                Ok(TryLock::Gone) => continue,
                Ok(TryLock::Busy(ino, sec, nsec, contents)) => {
                    if !waited {
                        waited = true;
                        self.count(|s| s.lock_waits += 1);
                    }
                    let now = Instant::now();
                    let stale = match seen {
                        Some((i, s, n, since)) if (i, s, n) == (ino, sec, nsec) => {
                            now.duration_since(since) >= self.stale_after
                        }
                        _ => {
                            seen = Some((ino, sec, nsec, now));
                            false
                        }
                    };
                    if stale || holder_is_gone(&contents) {
                        self.break_lock(key, ino);
                        seen = None;
                        continue;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                    if let Some(out) = self.get_quiet(key) {
                        return Ok((out, true));
                    }
                }
                Err(e) => {
                    self.error(
                        "lock",
                        &format!(
                            "cannot make a lock file in '{}': {e}; compiling without one",
                            self.dir().display()
                        ),
                    );
                    let out = compile()?;
                    self.put(key, label, &out);
                    return Ok((out, false));
                }
            }
        }
    }

    /// [`get`](Self::get) for polling: a missing entry is not counted as a miss.
    fn get_quiet(&self, key: &CacheKey) -> Option<CompileOutput> {
        if !self.entry_path(key).exists() {
            return None;
        }
        self.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::jit::{KernelSignature, ParamType};
    use std::sync::atomic::AtomicU32;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "offload-disk-{tag}-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn config(dir: &Path) -> DiskConfig {
        DiskConfig {
            mode: DiskMode::ReadWrite,
            dir: dir.to_path_buf(),
            max_size: 1 << 30,
            trust: false,
            note: None,
        }
    }

    fn key(n: u64) -> CacheKey {
        CacheKey(*blake3::hash(&n.to_le_bytes()).as_bytes())
    }

    fn output(n: u64) -> CompileOutput {
        CompileOutput {
            bytes: (0..100 + n).map(|i| (i * 7 + n) as u8).collect(),
            signatures: vec![KernelSignature {
                name: format!("k{n}"),
                params: vec![
                    ParamType::Ptr,
                    ParamType::I32,
                    ParamType::Other("i16".into()),
                ],
            }],
        }
    }

    fn same(a: &CompileOutput, b: &CompileOutput) -> bool {
        a.bytes == b.bytes && a.signatures == b.signatures
    }

    /// splitmix64
    fn rng(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    #[test]
    fn entries_round_trip() {
        let e = encode_entry(&key(1), "label", &output(1));
        let (label, out) = decode_entry(&key(1), &e).unwrap();
        assert_eq!(label, "label");
        assert!(same(&out, &output(1)));
    }

    /// Every change to an entry (bytes flipped, cut, added, another key, another schema) is
    /// refused with a reason, never a panic and never another image. Seeded; set
    /// `OFFLOAD_TEST_SEED` to rerun one.
    #[test]
    fn mutated_entries_are_refused() {
        let seed: u64 = std::env::var("OFFLOAD_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x00ff_10ad);
        let mut s = seed;
        let good = encode_entry(&key(7), "x86_64 x86-64", &output(7));
        for i in 0..5000 {
            let mut m = good.clone();
            match rng(&mut s) % 6 {
                0 => {
                    let at = (rng(&mut s) % m.len() as u64) as usize;
                    m[at] ^= 1 << (rng(&mut s) % 8);
                }
                1 => m.truncate((rng(&mut s) % m.len() as u64) as usize),
                2 => m.extend((0..1 + rng(&mut s) % 40).map(|_| rng(&mut s) as u8)),
                3 => {
                    // Several random bytes at once.
                    for _ in 0..1 + rng(&mut s) % 8 {
                        let at = (rng(&mut s) % m.len() as u64) as usize;
                        m[at] = rng(&mut s) as u8;
                    }
                }
                4 => {
                    // Another schema with a matching digest (a file of another version).
                    let v = (rng(&mut s) % 5) as u32;
                    m[8..12].copy_from_slice(&(if v == SCHEMA { 0 } else { v }).to_le_bytes());
                    let n = m.len() - TRAILER;
                    let d = blake3::hash(&m[..n]);
                    m[n..].copy_from_slice(d.as_bytes());
                }
                _ => {
                    // A length field that overflows when added up.
                    let v = u64::MAX - rng(&mut s) % 100;
                    m[44..52].copy_from_slice(&v.to_le_bytes());
                }
            }
            if m == good {
                continue;
            }
            match decode_entry(&key(7), &m) {
                Err(why) => assert!(!why.is_empty()),
                Ok(_) => panic!("seed {seed}, mutant {i}: a changed entry was accepted"),
            }
        }
        // Another key's entry, intact.
        let other = encode_entry(&key(8), "", &output(8));
        let why = decode_entry(&key(7), &other).unwrap_err();
        assert!(why.contains("instead of"), "{why}");
    }

    #[test]
    fn bad_files_are_misses_that_are_removed_and_written_again() {
        let d = dir("bad");
        let cache = DiskCache::new(config(&d));
        cache.put(&key(1), "one", &output(1));
        let path = cache.entry_path(&key(1));
        assert!(same(&cache.get(&key(1)).unwrap(), &output(1)));
        let good = std::fs::read(&path).unwrap();
        let mut schema0 = good.clone();
        schema0[8..12].copy_from_slice(&0u32.to_le_bytes());
        let n = schema0.len() - TRAILER;
        let digest = blake3::hash(&schema0[..n]);
        schema0[n..].copy_from_slice(digest.as_bytes());
        let mut flipped = good.clone();
        flipped[HEADER + 20] ^= 0x40;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() / 2].to_vec()),
            ("flipped", flipped),
            ("wrong key", encode_entry(&key(2), "two", &output(2))),
            ("old schema", schema0),
            ("empty", Vec::new()),
        ];
        for (what, bytes) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let before = cache.stats().bad_entries;
            assert!(cache.get(&key(1)).is_none(), "{what}");
            assert_eq!(cache.stats().bad_entries, before + 1, "{what}");
            assert!(!path.exists(), "{what}: the bad entry is removed");
            let compiles = AtomicU32::new(0);
            let (out, from_disk) = cache
                .get_or_compile(&key(1), "one", || {
                    compiles.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ()>(output(1))
                })
                .unwrap();
            assert!(!from_disk && same(&out, &output(1)), "{what}");
            assert_eq!(compiles.load(Ordering::Relaxed), 1, "{what}");
            assert!(same(&cache.get(&key(1)).unwrap(), &output(1)), "{what}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_directory_is_private_and_untrusted_ones_are_not_read() {
        let d = dir("trust");
        let cache = DiskCache::new(config(&d));
        cache.put(&key(1), "one", &output(1));
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        for mode in [0o770, 0o707, 0o777] {
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            let fresh = DiskCache::new(config(&d));
            assert!(fresh.get(&key(1)).is_none(), "mode {mode:o}");
            let why = fresh.usable().unwrap_err();
            assert!(why.contains("writable by"), "{why}");
            let trusting = DiskCache::new(DiskConfig {
                trust: true,
                ..config(&d)
            });
            assert!(trusting.get(&key(1)).is_some(), "mode {mode:o}, trusted");
        }
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        // Owned by someone else (the tests may run as root, who can give it away).
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid path; chown has no other preconditions.
        if unsafe { libc::chown(c.as_ptr(), 65534, 65534) } == 0 {
            let fresh = DiskCache::new(config(&d));
            let why = fresh.usable().unwrap_err();
            assert!(why.contains("owned by user 65534"), "{why}");
            assert!(fresh.get(&key(1)).is_none());
        } else {
            // Not root: another user's directory is what /tmp's sticky parent is.
            let fresh = DiskCache::new(config(Path::new("/")));
            assert!(fresh.usable().unwrap_err().contains("owned by user 0"));
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unusable_directory_never_fails_a_compile() {
        let file = dir("file");
        std::fs::write(&file, b"not a directory").unwrap();
        for bad in [file.join("sub"), file.clone()] {
            let cache = DiskCache::new(config(&bad));
            assert!(cache.get(&key(1)).is_none());
            let (out, from_disk) = cache
                .get_or_compile(&key(1), "", || Ok::<_, ()>(output(1)))
                .unwrap();
            assert!(!from_disk && same(&out, &output(1)));
            cache.put(&key(1), "", &output(1));
            assert!(cache.stats().errors >= 1);
        }
        let _ = std::fs::remove_file(&file);
        // A directory that goes away after it was found usable: the lock and the write fail,
        // the compile does not.
        let gone = dir("gone");
        let cache = DiskCache::new(config(&gone));
        cache.usable().unwrap();
        std::fs::remove_dir_all(&gone).unwrap();
        let (out, from_disk) = cache
            .get_or_compile(&key(2), "", || Ok::<_, ()>(output(2)))
            .unwrap();
        assert!(!from_disk && same(&out, &output(2)));
        assert_eq!(cache.stats().errors, 2, "{:?}", cache.stats()); // the lock, the write
    }

    #[test]
    fn read_only_caches_are_read_but_never_written() {
        let d = dir("ro");
        DiskCache::new(config(&d)).put(&key(1), "", &output(1));
        let ro = DiskCache::new(DiskConfig {
            mode: DiskMode::ReadOnly,
            ..config(&d)
        });
        assert!(same(&ro.get(&key(1)).unwrap(), &output(1)));
        let (_, from_disk) = ro
            .get_or_compile(&key(2), "", || Ok::<_, ()>(output(2)))
            .unwrap();
        assert!(!from_disk);
        assert!(!ro.entry_path(&key(2)).exists());
        assert!(ro.prune().is_err() && ro.clear().is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Two caches on one directory (as two processes): the second waits for the first's
    /// compile and reads its entry; one compile in all.
    #[test]
    fn a_second_requester_waits_for_the_first_compile() {
        let d = dir("wait");
        let compiles = AtomicU32::new(0);
        let a = DiskCache::new(config(&d));
        let b = DiskCache::new(config(&d));
        // Ordered by events, not by sleeps: A's compile starts (A holds the lock), then B
        // starts and finds the lock busy, then A's compile ends.
        let (locked, started) = std::sync::mpsc::channel();
        let compile_a = || {
            compiles.fetch_add(1, Ordering::SeqCst);
            locked.send(()).unwrap();
            // Polled for the event, bounded (20 s).
            let waited = (0..20_000).any(|_| {
                let seen = b.stats().lock_waits == 1;
                if !seen {
                    std::thread::sleep(Duration::from_millis(1));
                }
                seen
            });
            assert!(waited, "the second requester never waited for the lock");
            Ok::<_, ()>(output(3))
        };
        let compile_b = || {
            compiles.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(output(3))
        };
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(|| a.get_or_compile(&key(3), "", compile_a).unwrap());
            started.recv().unwrap();
            let tb = s.spawn(|| b.get_or_compile(&key(3), "", compile_b).unwrap());
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert_eq!(compiles.load(Ordering::SeqCst), 1);
        assert!(same(&ra.0, &output(3)) && same(&rb.0, &output(3)));
        assert!(!ra.1 && rb.1, "the second is served from the disk");
        assert_eq!(b.stats().lock_waits, 1);
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(LOCK_EXT) || n.starts_with(TMP_PREFIX))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A lock left by a process that is gone is broken at once (not after STALE_AFTER).
    #[test]
    fn a_dead_holders_lock_is_broken() {
        let d = dir("stale");
        let cache = DiskCache::new(config(&d));
        cache.usable().unwrap();
        // A process that has exited: a child we waited for.
        let child = std::process::Command::new("true").spawn().unwrap().wait();
        assert!(child.is_ok());
        let mine = holder_identity();
        let mut lines: Vec<&str> = mine.lines().collect();
        lines[2] = "4194303"; // above any pid_max default: no such process
        let contents = format!("{LOCK_MAGIC}\n{}\n", lines.join("\n"));
        std::fs::write(cache.lock_path(&key(4)), contents).unwrap();
        // Broken because its holder is gone, not because it went stale: with an hour's
        // staleness, waiting for it would outlast the minute this test gives it.
        // A detached thread (not a scope): if the lock is not broken, the test fails at the
        // deadline instead of waiting for the hour.
        let cache = std::sync::Arc::new(cache.with_stale_after(Duration::from_secs(3600)));
        let (done, result) = std::sync::mpsc::channel();
        let worker = cache.clone();
        std::thread::spawn(move || {
            let _ = done.send(
                worker
                    .get_or_compile(&key(4), "", || Ok::<_, ()>(output(4)))
                    .unwrap(),
            );
        });
        let (out, from_disk) = result
            .recv_timeout(Duration::from_secs(60))
            .expect("the dead holder's lock was not broken at once");
        assert!(!from_disk && same(&out, &output(4)));
        assert_eq!(cache.stats().locks_broken, 1);
        assert!(!cache.lock_path(&key(4)).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A lock of a holder on another machine that stopped refreshing it is broken once it
    /// has not changed for the staleness time; a live holder's lock, refreshed, never is, however
    /// long its compile takes.
    #[test]
    fn locks_are_broken_only_when_they_stop_changing() {
        let d = dir("heartbeat");
        let stale = Duration::from_millis(300);
        let cache = DiskCache::new(config(&d)).with_stale_after(stale);
        cache.usable().unwrap();
        std::fs::write(
            cache.lock_path(&key(5)),
            format!("{LOCK_MAGIC}\nanother-machine\nns\n1\n1\n"),
        )
        .unwrap();
        let t = Instant::now();
        let (_, from_disk) = cache
            .get_or_compile(&key(5), "", || Ok::<_, ()>(output(5)))
            .unwrap();
        assert!(!from_disk);
        assert!(t.elapsed() >= stale, "broken too early: {:?}", t.elapsed());
        assert_eq!(cache.stats().locks_broken, 1);

        let compiles = AtomicU32::new(0);
        let a = DiskCache::new(config(&d)).with_stale_after(stale);
        let b = DiskCache::new(config(&d)).with_stale_after(stale);
        let slow = || {
            compiles.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(stale * 4);
            Ok::<_, ()>(output(6))
        };
        let (locked, started) = std::sync::mpsc::channel();
        let slow_a = || {
            locked.send(()).unwrap();
            slow()
        };
        std::thread::scope(|s| {
            let ta = s.spawn(|| a.get_or_compile(&key(6), "", slow_a).unwrap());
            // B starts once A holds the lock (its compile has begun).
            started.recv().unwrap();
            let tb = s.spawn(|| b.get_or_compile(&key(6), "", slow).unwrap());
            assert!(!ta.join().unwrap().1);
            assert!(tb.join().unwrap().1, "the waiter reads the holder's entry");
        });
        assert_eq!(compiles.load(Ordering::SeqCst), 1);
        assert_eq!(b.stats().locks_broken, 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    fn set_mtime(path: &Path, secs_ago: i64) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let t = [
            libc::timespec {
                tv_sec: now - secs_ago,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: now - secs_ago,
                tv_nsec: 0,
            },
        ];
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(
            // SAFETY: a valid path and two valid timespecs.
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) },
            0
        );
    }

    #[test]
    fn pruning_keeps_the_most_recently_used_under_the_cap_and_only_its_own_files() {
        let d = dir("prune");
        let writer = DiskCache::new(config(&d));
        for n in 0..20 {
            writer.put(&key(n), "", &output(n));
            set_mtime(&writer.entry_path(&key(n)), 1000 - n as i64 * 10);
        }
        // Files the cache did not write, some named like its own.
        let foreign = [
            d.join("notes.txt"),
            d.join(format!("{}{ENTRY_EXT}", "a".repeat(64))),
            d.join(format!("{}{ENTRY_EXT}", "B".repeat(64))),
        ];
        for f in &foreign {
            std::fs::write(f, vec![b'x'; 5000]).unwrap();
            set_mtime(f, 5000);
        }
        std::fs::create_dir(d.join("sub")).unwrap();
        // A leftover of a killed writer.
        let leftover = d.join(format!("{TMP_PREFIX}{}.entry.1.1", "c".repeat(64)));
        std::fs::write(&leftover, b"half").unwrap();
        set_mtime(&leftover, 7200);
        let used = writer.entry_path(&key(0));
        let size = std::fs::metadata(&used).unwrap().len();
        let cap = size * 8;
        let cache = DiskCache::new(DiskConfig {
            max_size: cap,
            ..config(&d)
        });
        // Using the oldest entry makes it the newest.
        set_mtime(&used, 3600);
        assert!(cache.get(&key(0)).is_some());
        let r = cache.prune().unwrap();
        assert!(r.bytes_left <= cap, "{r:?}");
        assert_eq!(r.leftovers, 1);
        assert!(!leftover.exists());
        let summary = cache.summary().unwrap();
        assert!(summary.bytes <= cap, "{summary:?}");
        assert_eq!(summary.others, 4, "{summary:?}"); // the three files and the directory
        assert!(used.exists(), "the most recently used entry stays");
        assert!(cache.entry_path(&key(19)).exists());
        assert!(!cache.entry_path(&key(1)).exists());
        for f in &foreign {
            assert!(f.exists(), "{} was deleted", f.display());
        }
        assert!(d.join("sub").is_dir());
        let _ = std::fs::remove_dir_all(&d);
    }
}
