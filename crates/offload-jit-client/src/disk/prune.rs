//! Keeping the directory within its size cap and listing it: pruning (oldest use first,
//! leftover locks and temporary files), the summary, `offload cache` listings, clearing.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Entry,
    Lock,
    Temporary,
    /// The prune stamp and toolchain memos.
    Meta,
    Other,
}

/// A lock or temporary file untouched for [`LEFTOVER_AFTER`]: its process was killed (a live
/// lock is refreshed every tenth of [`STALE_AFTER`], a write takes moments).
pub(super) fn is_leftover(m: &std::fs::Metadata) -> bool {
    m.modified()
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > LEFTOVER_AFTER)
}

pub(super) fn has_magic(path: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == *MAGIC)
}

/// An entry file checked in full: its label, or what is wrong with it.
pub(super) fn check_file(path: &Path, key_hex: &str) -> std::result::Result<String, String> {
    let mut key = [0u8; 32];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&key_hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    let bytes = offload_core::fs::read_regular(path, "the entry").map_err(|e| e.to_string())?;
    decode_entry(&CacheKey(key), &bytes).map(|(label, _)| label)
}

impl DiskCache {
    pub(super) fn maybe_prune(&self, written: u64) {
        let stamp = self.dir().join(PRUNE_STAMP);
        let due = written > self.config.max_size / 16
            || std::fs::metadata(&stamp)
                .and_then(|m| m.modified())
                .map(|t| {
                    SystemTime::now()
                        .duration_since(t)
                        .is_ok_and(|age| age >= PRUNE_EVERY)
                })
                .unwrap_or(true);
        if due {
            let _ = self.prune();
        }
    }

    /// Every file in the directory with what the cache makes of it: a file named like an entry
    /// is one only if it starts with the entry magic.
    pub(super) fn scan(&self) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata, Kind)>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir())? {
            let e = e?;
            // DirEntry::metadata does not follow symlinks (an fstatat on the open directory).
            let Ok(m) = e.metadata() else {
                continue;
            };
            let name = e.file_name();
            let name = name.to_string_lossy();
            let kind = if !m.is_file() {
                Kind::Other
            } else if name.strip_suffix(ENTRY_EXT).is_some_and(is_hex_key) && has_magic(&e.path()) {
                // (A file named like an entry without the magic is not the cache's.)
                Kind::Entry
            } else if name.strip_suffix(LOCK_EXT).is_some_and(is_hex_key) {
                Kind::Lock
            } else if name.starts_with(TMP_PREFIX) {
                Kind::Temporary
            } else if name == PRUNE_STAMP
                || (name.starts_with("toolchain-") && name.ends_with(".id"))
            {
                Kind::Meta
            } else {
                Kind::Other
            };
            out.push((e.path(), m, kind));
        }
        Ok(out)
    }

    /// Deletes least recently used entries until the directory holds at most 90 % of the cap
    /// (nothing if it is under the cap), and leftovers of killed processes.
    pub fn prune(&self) -> std::result::Result<PruneReport, String> {
        self.usable()?;
        if self.config.mode != DiskMode::ReadWrite {
            return Err("the cache is read-only (OFFLOAD_CACHE=read-only)".into());
        }
        self.written_since_prune.store(0, Ordering::Relaxed);
        let _ = write_atomically(&self.dir().join(PRUNE_STAMP), b"");
        let _activity = offload_core::diag::activity(format!(
            "pruning the JIT disk cache {}",
            self.dir().display()
        ));
        let _span = tracing::info_span!(target: "offload::jit", "disk cache prune",
            "prune the disk cache {}", self.dir().display())
        .entered();
        let files = self
            .scan()
            .map_err(|e| format!("cannot list '{}': {e}", self.dir().display()))?;
        let mut report = PruneReport::default();
        let mut entries = Vec::new();
        for (path, m, kind) in files {
            match kind {
                Kind::Entry => entries.push((path, m)),
                Kind::Lock | Kind::Temporary
                    if is_leftover(&m) && std::fs::remove_file(&path).is_ok() =>
                {
                    report.leftovers += 1;
                }
                _ => {}
            }
        }
        let mut total: u64 = entries.iter().map(|(_, m)| m.len()).sum();
        report.entries_left = entries.len() as u64;
        if total > self.config.max_size {
            let low_water = self.config.max_size / 10 * 9;
            entries.sort_by_key(|(_, m)| (m.mtime(), m.mtime_nsec()));
            for (path, m) in entries {
                if total <= low_water {
                    break;
                }
                if std::fs::remove_file(&path).is_ok() {
                    total -= m.len();
                    report.deleted += 1;
                    report.freed += m.len();
                    report.entries_left -= 1;
                }
            }
        }
        report.bytes_left = total;
        self.count(|s| s.pruned += report.deleted);
        tracing::info!(
            target: "offload::jit",
            "disk cache pruned: {} entries ({} bytes) deleted, {} entries ({} bytes) left",
            report.deleted,
            report.freed,
            report.entries_left,
            report.bytes_left
        );
        Ok(report)
    }

    /// What the directory holds, each file named like an entry checked for the entry magic
    /// and measured (a `stat` and a read per entry: `offload cache stats`).
    pub fn summary(&self) -> std::result::Result<DirSummary, String> {
        let files = self
            .scan()
            .map_err(|e| format!("cannot list '{}': {e}", self.dir().display()))?;
        let mut s = DirSummary::default();
        for (_, m, kind) in files {
            match kind {
                Kind::Entry => {
                    s.entries += 1;
                    s.bytes += m.len();
                }
                Kind::Lock => s.locks += 1,
                Kind::Temporary => s.temporaries += 1,
                Kind::Meta => {}
                Kind::Other => s.others += 1,
            }
        }
        Ok(s)
    }

    /// How many files the directory holds that are named like entries, locks and temporaries,
    /// from the directory listing alone (no `stat`, no read: `offload info`, fast on a cache of
    /// thousands of entries, where a `stat` each costs milliseconds). A file of another
    /// program named like an entry counts as one here, unlike in [`DiskCache::summary`];
    /// pruning and clearing delete only files with the entry magic.
    pub fn count_by_name(&self) -> std::result::Result<NameCount, String> {
        let cannot = |e: std::io::Error| format!("cannot list '{}': {e}", self.dir().display());
        let mut c = NameCount::default();
        for e in std::fs::read_dir(self.dir()).map_err(cannot)? {
            let e = e.map_err(cannot)?;
            // From the listing's d_type where the filesystem fills it in.
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.strip_suffix(ENTRY_EXT).is_some_and(is_hex_key) {
                c.entries += 1;
            } else if name.strip_suffix(LOCK_EXT).is_some_and(is_hex_key) {
                c.locks += 1;
            } else if name.starts_with(TMP_PREFIX) {
                c.temporaries += 1;
            }
        }
        Ok(c)
    }

    /// Every entry, most recently used first, each checked in full.
    pub fn list(&self) -> std::result::Result<Vec<EntryInfo>, String> {
        let files = self
            .scan()
            .map_err(|e| format!("cannot list '{}': {e}", self.dir().display()))?;
        let mut out: Vec<EntryInfo> = files
            .into_iter()
            .filter(|(_, _, k)| *k == Kind::Entry)
            .map(|(path, m, _)| {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let key_hex = name.strip_suffix(ENTRY_EXT).unwrap_or(name).to_string();
                let label = check_file(&path, &key_hex);
                EntryInfo {
                    key: key_hex,
                    bytes: m.len(),
                    last_used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    label,
                    path,
                }
            })
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        Ok(out)
    }

    /// Deletes every entry the cache wrote (and leftovers of killed processes; a compile or
    /// write in progress elsewhere is left to finish); returns how many entries and bytes.
    pub fn clear(&self) -> std::result::Result<(u64, u64), String> {
        if self.config.mode != DiskMode::ReadWrite {
            return Err("the cache is read-only (OFFLOAD_CACHE=read-only)".into());
        }
        let files = self
            .scan()
            .map_err(|e| format!("cannot list '{}': {e}", self.dir().display()))?;
        let (mut n, mut bytes) = (0, 0);
        for (path, m, kind) in files {
            match kind {
                Kind::Entry if std::fs::remove_file(&path).is_ok() => {
                    n += 1;
                    bytes += m.len();
                }
                Kind::Lock | Kind::Temporary if is_leftover(&m) => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        Ok((n, bytes))
    }
}
