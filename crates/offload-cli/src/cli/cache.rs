//! `offload cache stats|list|clear|prune [--json]`: the JIT's disk cache (the directory of
//! `OFFLOAD_CACHE_DIR`, or `$XDG_CACHE_HOME/offload/jit`, or `~/.cache/offload/jit`);
//! `offload cache remote ping|stats|clear`: its remote tier (`OFFLOAD_CACHE_REMOTE`).

use super::out::outln;
use super::{Failure, human_bytes};
use offload_core::text::printable;
use offload_jit_client::{DiskCache, DiskConfig, DiskMode, RemoteCache, RemoteConfig};
use serde_json::json;
use std::time::SystemTime;

#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// What the cache holds and its settings.
    Stats {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Every entry, most recently used first, each checked in full.
    List {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete every entry the cache wrote (other files are left alone).
    Clear,
    /// Delete least recently used entries until the cache is under OFFLOAD_CACHE_MAX_SIZE.
    Prune,
    /// The remote cache of OFFLOAD_CACHE_REMOTE (a Redis): ping, stats, clear.
    Remote {
        #[command(subcommand)]
        action: RemoteAction,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum RemoteAction {
    /// Whether the server answers, and how fast.
    Ping,
    /// The server, whether entries are signed, and this namespace's entries and bytes.
    Stats {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete every key of this cache's namespace (entries and locks; nothing else).
    Clear,
}

/// `offload cache remote …`.
fn remote(action: RemoteAction) -> Result<(), Failure> {
    let Some(config) = RemoteConfig::from_env().map_err(Failure::input)? else {
        return Err(Failure::Usage(format!(
            "no remote cache: {} is not set (e.g. redis://host:6379/0)",
            offload_jit_client::remote::REMOTE[0]
        )));
    };
    let cache = RemoteCache::new(config);
    let c = cache.config();
    let signed = c.mac_key.is_some();
    match action {
        RemoteAction::Ping => {
            let (answer, took) = cache.ping().map_err(Failure::Runtime)?;
            outln!(
                "{}: {answer} in {:.3} ms",
                c.server,
                took.as_secs_f64() * 1e3
            );
        }
        RemoteAction::Stats { json } => {
            let (entries, bytes) = cache.summary().map_err(Failure::Runtime)?;
            if json {
                outln!(
                    "{}",
                    json!({
                        "server": c.server,
                        "namespace": c.namespace,
                        "signed": signed,
                        "entries": entries,
                        "bytes": bytes,
                        "max_value": c.max_value,
                    })
                );
                return Ok(());
            }
            outln!("remote   {} (namespace '{}')", c.server, c.namespace);
            outln!(
                "entries  {entries} ({}; values over {} are not stored)",
                human_bytes(bytes),
                human_bytes(c.max_value)
            );
            outln!("{}", signing(signed));
        }
        RemoteAction::Clear => {
            let n = cache.clear().map_err(Failure::Runtime)?;
            outln!(
                "removed {n} key(s) of namespace '{}' from {}",
                c.namespace,
                c.server
            );
        }
    }
    Ok(())
}

/// What signing means here, in one line.
fn signing(signed: bool) -> String {
    if signed {
        format!(
            "signing  on: only entries with a valid MAC ({}) are loaded",
            offload_jit_client::remote::REMOTE_KEY_FILE[0]
        )
    } else {
        format!(
            "signing  OFF: anyone who can write to this Redis can run code in every process that \
             reads from it (set {})",
            offload_jit_client::remote::REMOTE_KEY_FILE[0]
        )
    }
}

fn age(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) if d.as_secs() < 120 => format!("{} s ago", d.as_secs()),
        Ok(d) if d.as_secs() < 7200 => format!("{} min ago", d.as_secs() / 60),
        Ok(d) if d.as_secs() < 172_800 => format!("{} h ago", d.as_secs() / 3600),
        Ok(d) => format!("{} days ago", d.as_secs() / 86400),
        Err(_) => "in the future".into(),
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn cache(command: CacheCommand) -> Result<(), Failure> {
    offload::diagnostics::init(None).map_err(Failure::input)?;
    if let CacheCommand::Remote { action } = command {
        // Nothing of the disk's settings is needed.
        return remote(action);
    }
    let _progress = super::progress::start(matches!(
        command,
        CacheCommand::Stats { json: true } | CacheCommand::List { json: true }
    ));
    let config = DiskConfig::from_env().map_err(Failure::input)?;
    if let Some(note) = &config.note {
        return Err(Failure::Usage(note.clone()));
    }
    let mode = config.mode;
    let dir = config.dir.clone();
    let shown = printable(&dir.display().to_string()).into_owned();
    // The commands manage the directory whether or not compiles use it (OFFLOAD_CACHE=0).
    let disk = DiskCache::new(DiskConfig {
        mode: if mode == DiskMode::ReadOnly {
            DiskMode::ReadOnly
        } else {
            DiskMode::ReadWrite
        },
        ..config.clone()
    });
    let exists = dir.is_dir();
    match command {
        CacheCommand::Stats { json } => {
            let summary = if exists {
                Some(disk.summary().map_err(Failure::Runtime)?)
            } else {
                None
            };
            let s = summary.clone().unwrap_or_default();
            // The remote tier, as configured (its contents: `offload cache remote stats`).
            let remote = RemoteConfig::from_env().map_err(Failure::input)?;
            if json {
                outln!(
                    "{}",
                    json!({
                        "remote": remote.as_ref().map(|c| json!({
                            "server": c.server,
                            "namespace": c.namespace,
                            "signed": c.mac_key.is_some(),
                        })),
                        "dir": dir.display().to_string(),
                        "exists": exists,
                        "mode": mode.name(),
                        "max_bytes": config.max_size,
                        "trust": config.trust,
                        "entries": s.entries,
                        "bytes": s.bytes,
                        "locks": s.locks,
                        "temporaries": s.temporaries,
                        "other_files": s.others,
                    })
                );
                return Ok(());
            }
            outln!(
                "cache    {shown} ({}{})",
                mode.name(),
                if config.trust { ", trusted" } else { "" }
            );
            match &remote {
                Some(c) => {
                    outln!(
                        "remote   {} (namespace '{}'; `offload cache remote stats` for its entries)",
                        c.server,
                        c.namespace
                    );
                    outln!("{}", signing(c.mac_key.is_some()));
                }
                None => outln!(
                    "remote   off ({} unset)",
                    offload_jit_client::remote::REMOTE[0]
                ),
            }
            if summary.is_none() {
                outln!("entries  none (the directory does not exist yet)");
                return Ok(());
            }
            outln!(
                "entries  {} ({} of {} cap)",
                s.entries,
                human_bytes(s.bytes),
                human_bytes(config.max_size)
            );
            if s.locks + s.temporaries > 0 {
                outln!(
                    "busy     {} lock(s), {} temporary file(s) (compiles or writes in progress, \
                     or left by killed processes: pruning removes those after an hour)",
                    s.locks,
                    s.temporaries
                );
            }
            if s.others > 0 {
                outln!(
                    "others   {} file(s) the cache did not write (left alone)",
                    s.others
                );
            }
        }
        CacheCommand::List { json } => {
            let entries = if exists {
                disk.list().map_err(Failure::Runtime)?
            } else {
                Vec::new()
            };
            if json {
                let list: Vec<_> = entries
                    .iter()
                    .map(|e| {
                        json!({
                            "key": e.key,
                            "bytes": e.bytes,
                            "last_used_unix": unix(e.last_used),
                            "label": e.label.as_ref().ok(),
                            "error": e.label.as_ref().err(),
                        })
                    })
                    .collect();
                outln!(
                    "{}",
                    json!({ "dir": dir.display().to_string(), "entries": list })
                );
                return Ok(());
            }
            if entries.is_empty() {
                outln!("no entries in {shown}");
            }
            for e in &entries {
                let what = match &e.label {
                    Ok(l) => printable(l).into_owned(),
                    Err(why) => format!("BAD: {}", printable(why)),
                };
                outln!(
                    "{}  {:>10}  {:>12}  {what}",
                    &e.key[..16],
                    human_bytes(e.bytes),
                    age(e.last_used)
                );
            }
        }
        CacheCommand::Clear => {
            if !exists {
                outln!("nothing to clear: {shown} does not exist");
                return Ok(());
            }
            let (n, bytes) = disk.clear().map_err(Failure::Runtime)?;
            outln!(
                "removed {n} entr{} ({}) from {shown}",
                if n == 1 { "y" } else { "ies" },
                human_bytes(bytes)
            );
        }
        CacheCommand::Prune => {
            if !exists {
                outln!("nothing to prune: {shown} does not exist");
                return Ok(());
            }
            let r = disk.prune().map_err(Failure::Runtime)?;
            outln!(
                "pruned {} entr{} ({}); {shown} holds {} entr{} ({} of {} cap){}",
                r.deleted,
                if r.deleted == 1 { "y" } else { "ies" },
                human_bytes(r.freed),
                r.entries_left,
                if r.entries_left == 1 { "y" } else { "ies" },
                human_bytes(r.bytes_left),
                human_bytes(config.max_size),
                if r.leftovers > 0 {
                    format!("; removed {} file(s) left by killed processes", r.leftovers)
                } else {
                    String::new()
                }
            );
        }
        CacheCommand::Remote { action } => return remote(action),
    }
    Ok(())
}
