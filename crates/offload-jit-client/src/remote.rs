//! The JIT's remote cache: compiled images kept in a Redis that the nodes of a cluster share,
//! the third tier after memory and disk (`OFFLOAD_CACHE_REMOTE=redis://…`, `rediss://…` or
//! `redis+unix:///…`; off by default).
//!
//! - **Read through.** A request that misses in memory and on disk asks the remote before it
//!   compiles; a remote hit is written to the disk cache (so the next process of the node finds
//!   it there) and served as [`offload_core::jit::Served::RemoteHit`], without a JIT worker or
//!   LLVM. A compile writes disk and remote.
//! - **Same keys.** A value is stored under `<namespace>:entry:<disk key>`: the disk key is the
//!   content key with the toolchain identity and the entry schema, so two builds of the JIT
//!   never share an entry. The value is the disk entry (which checks itself: magic, schema,
//!   key, length, BLAKE3 digest) in a small envelope; a truncated, corrupted or misplaced value
//!   is a miss with one warning, and the compile that follows replaces it. Values over
//!   `OFFLOAD_CACHE_REMOTE_MAX_VALUE` (default 64 MiB) are not stored.
//! - **Signed entries.** With `OFFLOAD_CACHE_REMOTE_KEY_FILE`, every value carries a keyed
//!   BLAKE3 MAC over its Redis key and its entry, and a value without a valid MAC is never
//!   loaded. Without a key file, **anyone who can write to the Redis can run code in every
//!   process that reads from it**: an entry is executable code.
//! - **One compile per key in the cluster.** A process that misses takes the key's lock in
//!   Redis (`SET <lock> <owner> NX PX <ttl>`), refreshes it while it compiles, and releases it
//!   only if it still owns it (compare-and-delete); the others poll for the value with back-off
//!   and read it. A holder that dies leaves a lock that expires, and the next waiter compiles;
//!   a failed compile stores nothing. The tiers below single-flight first (threads in memory,
//!   processes of a machine through the disk lock), so one node sends one request per key.
//! - **An outage costs only time.** Connect and operation timeouts (100 ms and 1 s by
//!   default); no retries. The first failure (down, slow, full, read-only, garbage) is one
//!   warning per process naming the server and the error; then the remote is not asked for
//!   [`BACKOFF`], and compiles go on with the disk.

use crate::disk::{decode_entry, encode_entry};
use offload_core::jit::{CacheKey, CompileOutput};
use offload_core::sync::lock;
use offload_core::{Error, Result, env};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The server: `redis://[user[:password]@]host[:port][/db]`, `rediss://…` (TLS), or
/// `redis+unix:///path[?db=N]`. Unset: no remote tier.
pub const REMOTE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE"];
/// A file holding the password (so that it is not on a command line or in the environment).
pub const REMOTE_PASSWORD_FILE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_PASSWORD_FILE"];
/// A file whose contents key the entries' MACs: set, only signed entries are loaded.
pub const REMOTE_KEY_FILE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_KEY_FILE"];
/// A PEM file of the certificate authority a `rediss://` server's certificate is checked
/// against (default: the system's).
pub const REMOTE_CA_FILE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_CA_FILE"];
/// The prefix of every Redis key the cache uses (default `offload-jit`).
pub const REMOTE_NAMESPACE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_NAMESPACE"];
/// The largest value stored (bytes, or with a K/M/G suffix; default 64 MiB).
pub const REMOTE_MAX_VALUE: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_MAX_VALUE"];
/// Milliseconds a connection may take (default 100).
pub const REMOTE_CONNECT_TIMEOUT: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_CONNECT_TIMEOUT"];
/// Milliseconds one operation may take (default 1000).
pub const REMOTE_TIMEOUT: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_TIMEOUT"];
/// Milliseconds a compile's lock lives unless its holder refreshes it (default 30000).
pub const REMOTE_LOCK_TTL: [&str; 1] = ["OFFLOAD_CACHE_REMOTE_LOCK_TTL"];

/// After a failure the remote is not asked for this long.
pub const BACKOFF: Duration = Duration::from_secs(30);
/// The longest a process waits for another's compile before it compiles itself (a holder's
/// compile is bounded by its own JIT timeout, 300 s by default).
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// First bytes of a value.
const MAGIC: &[u8; 4] = b"OFRC";
/// The envelope's version.
const VERSION: u8 = 1;
/// Flag: a MAC follows the entry.
const SIGNED: u8 = 1;
/// Bytes before the entry: magic, version, flags.
const ENVELOPE: usize = 4 + 1 + 1;
/// The MAC's length.
const MAC: usize = 32;

/// The remote tier's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// The URL as given (it may hold a password).
    pub url: String,
    /// The server for messages: the URL without its user, password and query.
    pub server: String,
    /// The password read from [`REMOTE_PASSWORD_FILE`].
    pub password: Option<String>,
    /// The MAC key derived from [`REMOTE_KEY_FILE`]'s contents.
    pub mac_key: Option<[u8; 32]>,
    /// The CA certificates of [`REMOTE_CA_FILE`] (PEM).
    pub ca: Option<Vec<u8>>,
    /// The prefix of every key.
    pub namespace: String,
    /// The largest value stored.
    pub max_value: u64,
    /// See [`REMOTE_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// See [`REMOTE_TIMEOUT`].
    pub timeout: Duration,
    /// See [`REMOTE_LOCK_TTL`].
    pub lock_ttl: Duration,
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL's password, the password file's or the key.
        f.debug_struct("RemoteConfig")
            .field("server", &self.server)
            .field("signed", &self.mac_key.is_some())
            .field("namespace", &self.namespace)
            .field("max_value", &self.max_value)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("lock_ttl", &self.lock_ttl)
            .finish_non_exhaustive()
    }
}

/// The URL without user information and query (where passwords go).
fn without_secrets(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

fn read_file(names: &[&str], what: &str) -> Result<Option<(String, Vec<u8>)>> {
    let Some((name, value)) = env::raw(names)? else {
        return Ok(None);
    };
    let bytes = offload_core::fs::read_regular(std::path::Path::new(&value), what)
        .map_err(|e| e.context(format!("environment variable {name}='{value}'")))?;
    Ok(Some((name, bytes)))
}

impl RemoteConfig {
    /// The settings from the environment; `None` when [`REMOTE`] is unset or empty. A bad
    /// value is an error naming the variable.
    pub fn from_env() -> Result<Option<RemoteConfig>> {
        let Some((name, url)) = env::raw(&REMOTE)? else {
            return Ok(None);
        };
        let url = url.trim().to_string();
        if url.is_empty() {
            return Ok(None);
        }
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if !matches!(
            scheme.as_deref(),
            Some("redis" | "rediss" | "redis+unix" | "unix")
        ) {
            return Err(Error::InvalidArgument(format!(
                "environment variable {name}='{}' is not a Redis URL: expected redis://host[:port][/db], \
                 rediss://… (TLS) or redis+unix:///path",
                without_secrets(&url)
            )));
        }
        redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|e| {
            Error::InvalidArgument(format!(
                "environment variable {name}='{}': {e}",
                without_secrets(&url)
            ))
        })?;
        let password = match read_file(&REMOTE_PASSWORD_FILE, "the password file")? {
            None => None,
            Some((var, bytes)) => {
                let text = String::from_utf8(bytes).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "environment variable {var}: the password file is not UTF-8"
                    ))
                })?;
                // One line: a final newline is not part of the password.
                Some(text.trim_end_matches(['\n', '\r']).to_string())
            }
        };
        let mac_key = match read_file(&REMOTE_KEY_FILE, "the key file")? {
            None => None,
            Some((var, bytes)) => {
                if bytes.len() < 16 {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {var}: the key file has {} bytes; a key has at least 16 \
                         (e.g. head -c 32 /dev/urandom > key)",
                        bytes.len()
                    )));
                }
                Some(blake3::derive_key(
                    "offload JIT remote cache MAC key 1",
                    &bytes,
                ))
            }
        };
        let ca = read_file(&REMOTE_CA_FILE, "the CA file")?.map(|(_, b)| b);
        let namespace = match env::raw(&REMOTE_NAMESPACE)? {
            None => "offload-jit".to_string(),
            Some((var, v)) => {
                if v.is_empty()
                    || v.len() > 200
                    || v.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {var}='{v}': a namespace is 1 to 200 characters, no spaces"
                    )));
                }
                v
            }
        };
        let ms = |names: &[&str], min, max, default| {
            env::u32_in_range(names, min, max, default).map(|v| Duration::from_millis(u64::from(v)))
        };
        Ok(Some(RemoteConfig {
            server: without_secrets(&url),
            url,
            password,
            mac_key,
            ca,
            namespace,
            max_value: env::size_in_range(&REMOTE_MAX_VALUE, 1, 1 << 40)?.unwrap_or(64 << 20),
            connect_timeout: ms(&REMOTE_CONNECT_TIMEOUT, 1, 600_000, 100)?,
            timeout: ms(&REMOTE_TIMEOUT, 1, 600_000, 1000)?,
            lock_ttl: ms(&REMOTE_LOCK_TTL, 100, 3_600_000, 30_000)?,
        }))
    }
}

/// What the remote tier did in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Lookups that found a valid value.
    pub hits: u64,
    /// Lookups that found none (refused values included).
    pub misses: u64,
    /// Values stored.
    pub writes: u64,
    /// Bytes of values read (hits).
    pub bytes_read: u64,
    /// Bytes of values stored.
    pub bytes_written: u64,
    /// Values refused: corrupted, of another key, unsigned or wrongly signed.
    pub refused: u64,
    /// Values not stored for their size.
    pub too_large: u64,
    /// Times this process waited for another's compile of the same key.
    pub lock_waits: u64,
    /// Failed operations (each starts a back-off).
    pub errors: u64,
}

/// The remote tier of one server (see the module docs). Nothing is connected until used.
pub struct RemoteCache {
    config: RemoteConfig,
    client: OnceLock<std::result::Result<redis::Client, String>>,
    conn: Mutex<Option<redis::Connection>>,
    /// No remote call before this.
    down_until: Mutex<Option<Instant>>,
    warned: AtomicBool,
    /// The values refused (key and the value's digest): each is counted and warned about
    /// once, however often it is read.
    refused: Mutex<std::collections::HashSet<(CacheKey, [u8; 32])>>,
    stats: Mutex<RemoteStats>,
    /// This process, in lock values.
    owner: String,
    locks: AtomicU64,
}

impl std::fmt::Debug for RemoteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Extends a lock's life if this owner still holds it.
const REFRESH: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
    return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/// Deletes a lock if this owner still holds it.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
    return redis.call('del', KEYS[1]) else return 0 end";
/// The value (`{1, value}`), or else the lock taken (`{2}`), or neither: another holds it
/// (`{0}`).
const GET_OR_LOCK: &str = "local v = redis.call('get', KEYS[1]) \
    if v then return {1, v} end \
    if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end \
    return {0}";
/// Stores the value, and deletes the lock if this owner still holds it.
const STORE_AND_RELEASE: &str = "redis.call('set', KEYS[1], ARGV[2]) \
    if redis.call('get', KEYS[2]) == ARGV[1] then redis.call('del', KEYS[2]) end \
    return 1";

/// What [`GET_OR_LOCK`] found.
enum Look {
    Value(Vec<u8>),
    Locked,
    Busy,
    /// An answer no script of ours gives (the server is not what it seems).
    Strange(String),
}

impl From<redis::Value> for Look {
    fn from(v: redis::Value) -> Look {
        let strange = |v: &dyn std::fmt::Debug| Look::Strange(format!("{:.80}", format!("{v:?}")));
        match v {
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(1), redis::Value::BulkString(b)] => Look::Value(b.clone()),
                [redis::Value::Int(2)] => Look::Locked,
                [redis::Value::Int(0)] => Look::Busy,
                other => strange(&other),
            },
            other => strange(&other),
        }
    }
}

impl RemoteCache {
    /// A cache of this server (nothing is connected yet).
    pub fn new(config: RemoteConfig) -> RemoteCache {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let nonce =
            blake3::hash(format!("{host} {} {:?}", std::process::id(), Instant::now()).as_bytes());
        RemoteCache {
            owner: format!("{host}:{}:{}", std::process::id(), &nonce.to_hex()[..16]),
            config,
            client: OnceLock::new(),
            conn: Mutex::new(None),
            down_until: Mutex::new(None),
            warned: AtomicBool::new(false),
            refused: Mutex::default(),
            stats: Mutex::default(),
            locks: AtomicU64::new(0),
        }
    }

    /// Its settings.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    /// What it did in this process.
    pub fn stats(&self) -> RemoteStats {
        *lock(&self.stats)
    }

    fn count(&self, f: impl FnOnce(&mut RemoteStats)) {
        f(&mut lock(&self.stats));
    }

    /// The Redis key of `key`'s value.
    pub fn entry_name(&self, key: &CacheKey) -> String {
        format!("{}:entry:{}", self.config.namespace, key.hex())
    }

    fn lock_name(&self, key: &CacheKey) -> String {
        format!("{}:lock:{}", self.config.namespace, key.hex())
    }

    fn client(&self) -> std::result::Result<&redis::Client, String> {
        self.client
            .get_or_init(|| {
                let mut info =
                    redis::IntoConnectionInfo::into_connection_info(self.config.url.as_str())
                        .map_err(|e| e.to_string())?;
                if let Some(p) = &self.config.password {
                    let settings = info.redis_settings().clone().set_password(p);
                    info = info.set_redis_settings(settings);
                }
                let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
                if tls {
                    install_crypto();
                }
                match (&self.config.ca, tls) {
                    (Some(ca), true) => redis::Client::build_with_tls(
                        info,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(ca.clone()),
                        },
                    ),
                    _ => redis::Client::open(info),
                }
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Whether the remote is being left alone after a failure.
    pub fn is_down(&self) -> bool {
        lock(&self.down_until).is_some_and(|t| Instant::now() < t)
    }

    /// A failure: counted, warned about once per process, and the start of a back-off.
    fn fail(&self, what: &str, error: &str) {
        self.count(|s| s.errors += 1);
        *lock(&self.down_until) = Some(Instant::now() + BACKOFF);
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!(
                "offload: warning: JIT remote cache {}: {what} failed: {error}; compiling without it \
                 (not asked again for {} s; one warning per process)",
                self.config.server,
                BACKOFF.as_secs()
            );
        } else {
            tracing::debug!(target: "offload::jit", "remote cache {}: {what} failed: {error}", self.config.server);
        }
    }

    /// Runs `f` on the connection (made first if there is none), or `None` when the remote is
    /// backing off or `f` failed (the connection is then dropped).
    fn op<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        if self.is_down() {
            return None;
        }
        let started = Instant::now();
        let mut conn = lock(&self.conn);
        if conn.is_none() {
            let made = self.client().and_then(|c| {
                let con = c
                    .get_connection_with_timeout(self.config.connect_timeout)
                    .map_err(|e| {
                        format!(
                            "connecting: {}",
                            self.explain(&e, self.config.connect_timeout, &REMOTE_CONNECT_TIMEOUT)
                        )
                    })?;
                con.set_read_timeout(Some(self.config.timeout))
                    .and_then(|()| con.set_write_timeout(Some(self.config.timeout)))
                    .map_err(|e| e.to_string())?;
                Ok(con)
            });
            match made {
                Ok(c) => *conn = Some(c),
                Err(e) => {
                    drop(conn);
                    self.fail(what, &e);
                    return None;
                }
            }
        }
        let result = f(conn.as_mut().expect("connected"));
        match result {
            Ok(v) => {
                drop(conn);
                tracing::debug!(target: "offload::jit", "remote cache: {what} in {:.3} ms", started.elapsed().as_secs_f64() * 1e3);
                Some(v)
            }
            Err(e) => {
                *conn = None;
                drop(conn);
                self.fail(
                    what,
                    &self.explain(&e, self.config.timeout, &REMOTE_TIMEOUT),
                );
                None
            }
        }
    }

    /// [`op`](Self::op) once while backing off (the back-off is kept, nothing more is
    /// warned).
    fn once_even_if_down<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let until = lock(&self.down_until).take();
        let warned = self.warned.swap(true, Ordering::Relaxed);
        let r = self.op(what, f);
        let mut d = lock(&self.down_until);
        *d = (*d).max(until);
        drop(d);
        self.warned.store(warned || r.is_none(), Ordering::Relaxed);
        r
    }

    /// An error as a user reads it: a timeout says how long and which variable sets it.
    fn explain(&self, e: &redis::RedisError, limit: Duration, variable: &[&str]) -> String {
        if e.is_timeout() {
            format!(
                "no answer in {} ms ({}: {e})",
                limit.as_millis(),
                variable[0]
            )
        } else {
            e.to_string()
        }
    }

    fn mac(&self, key: &[u8; 32], name: &str, entry: &[u8]) -> [u8; MAC] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(entry);
        *h.finalize().as_bytes()
    }

    /// The value stored for an entry: the envelope, the entry, and the MAC when signing.
    pub fn seal(&self, key: &CacheKey, entry: &[u8]) -> Vec<u8> {
        let name = self.entry_name(key);
        let mut v = Vec::with_capacity(ENVELOPE + entry.len() + MAC);
        v.extend_from_slice(MAGIC);
        v.push(VERSION);
        v.push(if self.config.mac_key.is_some() {
            SIGNED
        } else {
            0
        });
        v.extend_from_slice(entry);
        if let Some(k) = &self.config.mac_key {
            v.extend_from_slice(&self.mac(k, &name, entry));
        }
        v
    }

    /// The entry a value holds for `key`, or why it is refused.
    pub fn open(&self, key: &CacheKey, value: &[u8]) -> std::result::Result<CompileOutput, String> {
        if value.len() < ENVELOPE || value[..4] != *MAGIC {
            return Err(format!(
                "not a value of this cache ({} bytes, first bytes {:02x?})",
                value.len(),
                &value[..value.len().min(4)]
            ));
        }
        if value[4] != VERSION {
            return Err(format!(
                "envelope version {}; this build reads version {VERSION}",
                value[4]
            ));
        }
        let signed = value[5] & SIGNED != 0;
        if value[5] & !SIGNED != 0 {
            return Err(format!("unknown flags {:#04x}", value[5]));
        }
        let body = &value[ENVELOPE..];
        let entry = match (&self.config.mac_key, signed) {
            (Some(_), false) => {
                return Err(format!(
                    "it is not signed, and this process loads only signed entries ({} is set)",
                    REMOTE_KEY_FILE[0]
                ));
            }
            (Some(k), true) => {
                if body.len() < MAC {
                    return Err("truncated: shorter than its MAC".into());
                }
                let (entry, mac) = body.split_at(body.len() - MAC);
                let want = blake3::Hash::from(self.mac(k, &self.entry_name(key), entry));
                // Constant-time comparison (blake3::Hash's equality).
                if want != blake3::Hash::from(<[u8; MAC]>::try_from(mac).expect("32 bytes")) {
                    return Err(
                        "its MAC does not match (signed with another key, altered, or stored \
                         under another name)"
                            .into(),
                    );
                }
                entry
            }
            (None, true) => {
                if body.len() < MAC {
                    return Err("truncated: shorter than its MAC".into());
                }
                &body[..body.len() - MAC]
            }
            (None, false) => body,
        };
        decode_entry(key, entry).map(|(_, out)| out)
    }

    /// Looks `key` up (a plain `GET`: it works on a full server and on a replica). A refused
    /// value is a miss with one warning.
    pub fn get(&self, key: &CacheKey) -> Option<CompileOutput> {
        // A span: the Chrome trace shows each remote operation with its time.
        let _span =
            tracing::info_span!(target: "offload::jit", "remote get", key = %key.short()).entered();
        let name = self.entry_name(key);
        let value: Option<Vec<u8>> = self.op("get", |c| redis::cmd("GET").arg(&name).query(c))?;
        let Some(value) = value else {
            self.count(|s| s.misses += 1);
            return None;
        };
        self.accept(key, &value).ok()
    }

    /// The entry of a value found for `key`, counted as a hit; or, refused, counted (once per
    /// value) and warned about, the reason.
    fn accept(&self, key: &CacheKey, value: &[u8]) -> std::result::Result<CompileOutput, String> {
        match self.open(key, value) {
            Ok(out) => {
                self.count(|s| {
                    s.hits += 1;
                    s.bytes_read += value.len() as u64;
                });
                tracing::info!(target: "offload::jit", "remote cache: {} found ({} bytes)", key.short(), value.len());
                Ok(out)
            }
            Err(why) => {
                let first = lock(&self.refused).insert((*key, *blake3::hash(value).as_bytes()));
                self.count(|s| {
                    s.misses += 1;
                    s.refused += u64::from(first);
                });
                if first {
                    eprintln!(
                        "offload: warning: JIT remote cache {}: value '{}' is refused: {why}; \
                         compiling again (the compile replaces it)",
                        self.config.server,
                        self.entry_name(key)
                    );
                }
                Err(why)
            }
        }
    }

    /// Stores `out` under `key` (failures are warnings; a value over the size cap is not
    /// stored).
    pub fn put(&self, key: &CacheKey, label: &str, out: &CompileOutput) {
        let Some(value) = self.value_to_store(key, label, out) else {
            return;
        };
        let name = self.entry_name(key);
        let _span = tracing::info_span!(target: "offload::jit", "remote put", key = %key.short(), bytes = value.len()).entered();
        if self
            .op("store", |c| {
                redis::cmd("SET").arg(&name).arg(&value).query::<()>(c)
            })
            .is_some()
        {
            self.stored(key, value.len());
        }
    }

    /// The value for `out`, or `None` (counted, logged) when it is over the size cap.
    fn value_to_store(&self, key: &CacheKey, label: &str, out: &CompileOutput) -> Option<Vec<u8>> {
        let value = self.seal(key, &encode_entry(key, label, out));
        if value.len() as u64 > self.config.max_value {
            self.count(|s| s.too_large += 1);
            tracing::info!(target: "offload::jit", "remote cache: {} not stored: {} bytes, over {} ({})", key.short(), value.len(), self.config.max_value, REMOTE_MAX_VALUE[0]);
            return None;
        }
        Some(value)
    }

    fn stored(&self, key: &CacheKey, bytes: usize) {
        self.count(|s| {
            s.writes += 1;
            s.bytes_written += bytes as u64;
        });
        tracing::info!(target: "offload::jit", "remote cache: stored {} ({bytes} bytes)", key.short());
    }

    /// Returns the image for `key`: from the remote, or from another process's compile of it
    /// (waited for), or from `compile` (run with the key's lock held in Redis, refreshed
    /// meanwhile, then stored). The flag says whether it came from the remote. Past the first
    /// look each poll is one round trip (a script that reads the value or takes the lock), and
    /// the store releases the lock in the same one.
    pub fn get_or_compile<E>(
        &self,
        key: &CacheKey,
        label: &str,
        compile: impl FnOnce() -> std::result::Result<CompileOutput, E>,
    ) -> std::result::Result<(CompileOutput, bool), E> {
        if let Some(out) = self.get(key) {
            return Ok((out, true));
        }
        let entry = self.entry_name(key);
        let name = self.lock_name(key);
        let token = format!(
            "{}:{}",
            self.owner,
            self.locks.fetch_add(1, Ordering::Relaxed)
        );
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let started = Instant::now();
        let mut waited = false;
        let mut pause = Duration::from_millis(5);
        let _span = tracing::info_span!(target: "offload::jit", "remote lock", key = %key.short())
            .entered();
        loop {
            let look = self.op("lock", |c| {
                redis::Script::new(GET_OR_LOCK)
                    .key(&entry)
                    .key(&name)
                    .arg(&token)
                    .arg(ttl)
                    .invoke::<redis::Value>(c)
            });
            match look.map(Look::from) {
                // The remote is unusable: compile without it.
                None => return compile().map(|o| (o, false)),
                Some(Look::Value(v)) => match self.accept(key, &v) {
                    Ok(out) => {
                        if waited {
                            tracing::info!(target: "offload::jit", "remote cache: {} came after {:.1} ms of waiting", key.short(), started.elapsed().as_secs_f64() * 1e3);
                        }
                        return Ok((out, true));
                    }
                    // A bad value: compiled here and replaced (no lock: a rare case).
                    Err(_) => {
                        let out = compile()?;
                        self.put(key, label, &out);
                        return Ok((out, false));
                    }
                },
                Some(Look::Locked) => break,
                Some(Look::Busy) => {
                    if !waited {
                        waited = true;
                        self.count(|s| s.lock_waits += 1);
                        tracing::info!(target: "offload::jit", "remote cache: {} is being compiled by another process; waiting", key.short());
                    }
                    if started.elapsed() > MAX_WAIT {
                        tracing::warn!(target: "offload::jit", "remote cache: {} still locked after {} s; compiling here", key.short(), MAX_WAIT.as_secs());
                        return compile().map(|o| (o, false));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Some(Look::Strange(what)) => {
                    self.fail("lock", &format!("the lock script answered {what}"));
                    return compile().map(|o| (o, false));
                }
            }
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (held, owner) = (&name, &token);
        let result = std::thread::scope(|s| {
            s.spawn(move || {
                // Until the compile ends (the sender is dropped).
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(self.config.lock_ttl / 3)
                {
                    self.op("refresh the lock", |c| {
                        redis::Script::new(REFRESH)
                            .key(held)
                            .arg(owner)
                            .arg(ttl)
                            .invoke::<i64>(c)
                    });
                }
            });
            let result = compile();
            drop(stop);
            result
        });
        let stored = match &result {
            Ok(out) => self.store_and_release(key, label, out, &name, &token),
            Err(_) => false,
        };
        if !stored {
            // A failed compile (it stores nothing), a value too large, or a failed store: the
            // lock goes anyway, so that nobody waits for its expiry.
            self.release(&name, &token);
        }
        result.map(|o| (o, false))
    }

    /// Stores `out` and releases the lock in one round trip; whether it did.
    fn store_and_release(
        &self,
        key: &CacheKey,
        label: &str,
        out: &CompileOutput,
        lock: &str,
        token: &str,
    ) -> bool {
        let Some(value) = self.value_to_store(key, label, out) else {
            return false;
        };
        let name = self.entry_name(key);
        let _span = tracing::info_span!(target: "offload::jit", "remote put", key = %key.short(), bytes = value.len()).entered();
        let done = self
            .op("store", |c| {
                redis::Script::new(STORE_AND_RELEASE)
                    .key(&name)
                    .key(lock)
                    .arg(token)
                    .arg(&value)
                    .invoke::<i64>(c)
            })
            .is_some();
        if done {
            self.stored(key, value.len());
        }
        done
    }

    /// Deletes the lock if this owner still holds it. Also while backing off (once): a lock
    /// left behind would keep the others waiting until it expires.
    fn release(&self, name: &str, token: &str) {
        let release = |c: &mut redis::Connection| {
            redis::Script::new(RELEASE)
                .key(name)
                .arg(token)
                .invoke::<i64>(c)
        };
        if self.is_down() {
            self.once_even_if_down("release the lock", release);
        } else {
            self.op("release the lock", release);
        }
    }

    /// `PING`: the server's answer and the round trip, or the error.
    pub fn ping(&self) -> std::result::Result<(String, Duration), String> {
        let started = Instant::now();
        *lock(&self.down_until) = None;
        self.op("ping", |c| redis::cmd("PING").query::<String>(c))
            .map(|s| (s, started.elapsed()))
            .ok_or_else(|| NO_ANSWER.to_string())
    }

    /// Runs `each` on every batch of keys matching `<namespace>:<suffix>` (`SCAN`), the
    /// back-off lifted first (an explicit command asks the server whatever happened before).
    fn scan(
        &self,
        suffix: &str,
        mut each: impl FnMut(&[String]) -> std::result::Result<(), String>,
    ) -> std::result::Result<(), String> {
        *lock(&self.down_until) = None;
        let pattern = format!("{}:{suffix}", glob_escape(&self.config.namespace));
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .op("scan", |c| {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query(c)
                })
                .ok_or(NO_ANSWER)?;
            each(&keys)?;
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Deletes every key of this cache's namespace (entries and locks), `SCAN`ning for them;
    /// how many.
    pub fn clear(&self) -> std::result::Result<u64, String> {
        let mut deleted = 0u64;
        self.scan("*", |keys| {
            if !keys.is_empty() {
                deleted += self
                    .op("delete", |c| redis::cmd("DEL").arg(keys).query::<u64>(c))
                    .ok_or(NO_ANSWER)?;
            }
            Ok(())
        })?;
        Ok(deleted)
    }

    /// The entries of this namespace on the server and their bytes (one `STRLEN` a key), as
    /// `offload cache remote stats` shows.
    pub fn summary(&self) -> std::result::Result<(u64, u64), String> {
        let (mut entries, mut bytes) = (0u64, 0u64);
        self.scan("entry:*", |keys| {
            for k in keys {
                bytes += self
                    .op("size", |c| redis::cmd("STRLEN").arg(k).query::<u64>(c))
                    .ok_or(NO_ANSWER)?;
                entries += 1;
            }
            Ok(())
        })?;
        Ok((entries, bytes))
    }
}

/// What an explicit command reports when the server did not answer (the warning says why).
const NO_ANSWER: &str = "the server did not answer (see the warning above)";

/// `s` with Redis glob characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// rustls needs a process-wide crypto provider: ring's, unless the program installed one.
/// (rustls prefers aws-lc-rs, for its post-quantum key exchange; ring builds without cmake,
/// and classical key exchange is what Redis servers offer.)
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mac: Option<[u8; 32]>) -> RemoteConfig {
        RemoteConfig {
            url: "redis://127.0.0.1:1".into(),
            server: "redis://127.0.0.1:1".into(),
            password: None,
            mac_key: mac,
            ca: None,
            namespace: "t".into(),
            max_value: 1 << 20,
            connect_timeout: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
            lock_ttl: Duration::from_secs(1),
        }
    }

    fn output() -> CompileOutput {
        CompileOutput {
            bytes: b"\x7fELF image".to_vec(),
            signatures: Vec::new(),
        }
    }

    #[test]
    fn urls_lose_their_secrets_in_messages() {
        assert_eq!(
            without_secrets("redis://user:pw@host:6379/2"),
            "redis://host:6379/2"
        );
        assert_eq!(without_secrets("rediss://:p@ss@h/0"), "rediss://h/0");
        assert_eq!(
            without_secrets("redis+unix:///run/r.sock?pass=x&db=1"),
            "redis+unix:///run/r.sock"
        );
        let c = config(Some([7; 32]));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("127.0.0.1:1/") && shown.contains("signed: true"),
            "{shown}"
        );
    }

    #[test]
    fn values_open_only_under_their_key_and_with_a_valid_mac() {
        let key = CacheKey([1; 32]);
        let other = CacheKey([2; 32]);
        let signer = RemoteCache::new(config(Some([9; 32])));
        let plain = RemoteCache::new(config(None));
        let entry = encode_entry(&key, "label", &output());
        let signed = signer.seal(&key, &entry);
        let unsigned = plain.seal(&key, &entry);
        assert_eq!(signer.open(&key, &signed).unwrap().bytes, output().bytes);
        assert_eq!(plain.open(&key, &unsigned).unwrap().bytes, output().bytes);
        // A reader without the key checks the entry's own digest.
        assert!(plain.open(&key, &signed).is_ok());
        let e = signer.open(&key, &unsigned).unwrap_err();
        assert!(e.contains("not signed"), "{e}");
        let wrong = RemoteCache::new(config(Some([8; 32])));
        let e = wrong.open(&key, &signed).unwrap_err();
        assert!(e.contains("MAC does not match"), "{e}");
        // The value of another key, copied under this one.
        let moved = signer.seal(&other, &encode_entry(&other, "label", &output()));
        let e = signer.open(&key, &moved).unwrap_err();
        assert!(e.contains("MAC does not match"), "{e}");
        let e = plain
            .open(
                &key,
                &plain.seal(&other, &encode_entry(&other, "l", &output())),
            )
            .unwrap_err();
        assert!(e.contains("holds key"), "{e}");
    }

    #[test]
    fn every_mutation_of_a_signed_value_is_refused() {
        let key = CacheKey([3; 32]);
        let c = RemoteCache::new(config(Some([5; 32])));
        let value = c.seal(&key, &encode_entry(&key, "label", &output()));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let mut m = value.clone();
            match next() % 3 {
                0 => {
                    let i = (next() as usize) % m.len();
                    m[i] ^= 1 << (next() % 8);
                }
                1 => m.truncate((next() as usize) % m.len()),
                _ => m.push(next() as u8),
            }
            assert!(c.open(&key, &m).is_err(), "a mutated value opened");
        }
    }
}
