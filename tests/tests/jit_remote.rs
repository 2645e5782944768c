//! The JIT's remote cache (crates/offload-jit-client/src/remote.rs) against a real
//! `redis-server` that each test starts in a directory of its own, on a unix socket (or a TLS
//! port): processes with separate disk caches (standing for nodes) share compiles; 4 processes
//! of 4 threads compile each of 4 keys once; a holder killed mid-compile leaves a lock that
//! expires; corrupted, unsigned, wrongly signed and misplaced values are refused and replaced;
//! a Redis that is down, stopped, full or answering garbage costs only time; TLS with a
//! self-signed certificate; a password from a file. Needs `redis-server` (scripts/setup.sh
//! installs it): without it each test fails, naming it.

use offload_tests::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A disk cache of its own (a node) and the remote at `url`.
fn node_env(tag: &str, url: &str) -> Vec<(&'static str, String)> {
    let disk = scratch("redis-nodes").join(tag);
    vec![
        ("OFFLOAD_CACHE", "1".into()),
        ("OFFLOAD_CACHE_DIR", disk.display().to_string()),
        ("OFFLOAD_CACHE_REMOTE", url.to_string()),
    ]
}

fn with(
    mut env: Vec<(&'static str, String)>,
    more: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    env
}

fn load(threads: usize, env: &[(&str, String)]) -> Value {
    loader_json(&run_loader(threads, &which_images(), env).output().unwrap())
}

fn load_output(threads: usize, env: &[(&str, String)]) -> (Value, String) {
    let o = run_loader(threads, &which_images(), env).output().unwrap();
    let text = stderr(&o);
    (loader_json(&o), text)
}

#[test]
fn nodes_with_their_own_disks_share_compiles_through_the_remote() {
    let redis = Redis::start("share", &[]);
    let first = load(1, &node_env("share-a", &redis.url));
    assert_eq!(first["compiles"], 4, "{first}");
    assert_eq!(first["remote_hits"], 0, "{first}");
    assert_eq!(redis.keys("offload-jit:entry:*").len(), 4);
    assert!(redis.keys("offload-jit:lock:*").is_empty(), "locks left");
    // Another node: an empty disk, a warm remote. No worker, no LLVM.
    let second = load(2, &node_env("share-b", &redis.url));
    assert_eq!(second["compiles"], 0, "{second}");
    assert_eq!(second["remote_hits"], 4, "{second}");
    assert_eq!(second["worker_started"], false, "{second}");
    assert_eq!(second["llvm_mapped"], false, "{second}");
    assert_eq!(second["failures"], 0, "{second}");
    // The remote's hits were written to that node's disk.
    let third = load(1, &node_env("share-b", &redis.url));
    assert_eq!(third["disk_hits"], 4, "{third}");
    assert_eq!(third["remote_hits"], 0, "{third}");
    // Another namespace is another cache.
    let other = load(
        1,
        &with(
            node_env("share-c", &redis.url),
            &[("OFFLOAD_CACHE_REMOTE_NAMESPACE", "team-b")],
        ),
    );
    assert_eq!(other["compiles"], 4, "{other}");
    assert_eq!(redis.keys("team-b:entry:*").len(), 4);
    // The remote alone (no disk) works too.
    let no_disk = load(
        1,
        &with(node_env("share-d", &redis.url), &[("OFFLOAD_CACHE", "0")]),
    );
    assert_eq!(no_disk["remote_hits"], 4, "{no_disk}");
    assert_eq!(no_disk["compiles"], 0, "{no_disk}");

    // The command line: ping, stats, what `offload info` says of signing, clear (only its
    // namespace).
    let env = node_env("share-a", &redis.url);
    let cli = |args: &[&str]| {
        let pairs: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let o = offload(args, &pairs);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    assert!(cli(&["cache", "remote", "ping"]).contains("PONG"));
    let stats: Value = serde_json::from_str(&cli(&["cache", "remote", "stats", "--json"])).unwrap();
    assert_eq!(stats["entries"], 4, "{stats}");
    assert_eq!(stats["signed"], false, "{stats}");
    assert!(stats["bytes"].as_u64().unwrap() > 0, "{stats}");
    let info = cli(&["info"]);
    assert!(info.contains("UNSIGNED"), "{info}");
    assert!(cli(&["cache", "stats"]).contains("signing  OFF"));
    assert!(cli(&["cache", "remote", "clear"]).contains("removed 4 key(s)"));
    assert!(redis.keys("offload-jit:*").is_empty());
    assert_eq!(
        redis.keys("team-b:*").len(),
        4,
        "another namespace is left alone"
    );
}

#[test]
fn four_nodes_of_four_threads_compile_each_key_once() {
    let redis = Redis::start("many", &[]);
    let children: Vec<_> = (0..4)
        .map(|i| {
            run_loader(
                4,
                &which_images(),
                &node_env(&format!("many-{i}"), &redis.url),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let results: Vec<Value> = outputs.iter().map(loader_json).collect();
    let sum = |k: &str| results.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    let all: Vec<String> = results.iter().map(|r| r.to_string()).collect();
    assert_eq!(sum("compiles"), 4, "one compile per key in all: {all:?}");
    assert_eq!(sum("remote_hits"), 12, "{all:?}");
    assert_eq!(sum("failures"), 0, "{all:?}");
    assert!(redis.keys("offload-jit:lock:*").is_empty(), "locks left");
}

/// A JIT worker that waits before it starts: a compile that takes long enough to kill its
/// process in the middle (the wrapper's own contents make the toolchain, so both processes
/// use it).
fn slow_worker() -> PathBuf {
    let w = scratch("redis-slow").join("offload-jit-worker");
    std::fs::create_dir_all(w.parent().unwrap()).unwrap();
    std::fs::write(
        &w,
        format!(
            "#!/bin/sh\nsleep 3\nexec {} \"$@\"\n",
            build_dir().join("offload-jit-worker").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
    w
}

#[test]
fn a_holder_killed_mid_compile_leaves_a_lock_that_expires_and_the_next_compiles() {
    let redis = Redis::start("killed", &[]);
    let worker = slow_worker();
    let images = which_images();
    let one = &images[..1];
    let env = |tag: &str| {
        with(
            node_env(tag, &redis.url),
            &[
                ("OFFLOAD_JIT_WORKER", worker.to_str().unwrap()),
                ("OFFLOAD_CACHE_REMOTE_LOCK_TTL", "1500"),
            ],
        )
    };
    let mut holder = run_loader(1, one, &env("killed-a"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while redis.keys("offload-jit:lock:*").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the first process took no lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        redis.keys("offload-jit:lock:*").len(),
        1,
        "the dead holder's lock"
    );
    let o = run_loader(1, one, &env("killed-b")).output().unwrap();
    let r = loader_json(&o);
    assert_eq!(r["remote_lock_waits"], 1, "it waited for the lock: {r}");
    assert_eq!(r["compiles"], 1, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(redis.keys("offload-jit:entry:*").len(), 1);
    assert!(redis.keys("offload-jit:lock:*").is_empty(), "locks left");
}

/// The name of the one value there is.
fn the_value(redis: &Redis) -> String {
    let keys = redis.keys("offload-jit:entry:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].clone()
}

/// Sets `key` to `bytes` (through a file: redis-cli -x reads the value from stdin).
fn set_raw(redis: &Redis, key: &str, bytes: &[u8]) {
    let mut c = Command::new(redis_bin("redis-cli"))
        .args(&redis.cli)
        .args(["-x", "SET", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    assert!(c.wait().unwrap().success());
}

/// The raw bytes of `key` (redis-cli --raw GET, which adds a newline).
fn get_raw(redis: &Redis, key: &str) -> Vec<u8> {
    let o = Command::new(redis_bin("redis-cli"))
        .args(&redis.cli)
        .args(["--raw", "GET", key])
        .output()
        .unwrap();
    let mut v = o.stdout;
    assert_eq!(v.pop(), Some(b'\n'));
    v
}

#[test]
fn corrupted_misplaced_unsigned_and_wrongly_signed_values_are_refused_and_replaced() {
    let redis = Redis::start("refused", &[]);
    let keys_dir = scratch("redis-keys");
    std::fs::create_dir_all(&keys_dir).unwrap();
    let (key_a, key_b) = (keys_dir.join("a.key"), keys_dir.join("b.key"));
    std::fs::write(&key_a, random_bytes(32, 1)).unwrap();
    std::fs::write(&key_b, random_bytes(32, 2)).unwrap();
    let images = which_images();
    let (one, two) = (&images[..1], &images[..2]);
    let run = |tag: &str, images: &[(PathBuf, &str)], more: &[(&'static str, &str)]| {
        let o = run_loader(1, images, &with(node_env(tag, &redis.url), more))
            .output()
            .unwrap();
        let text = stderr(&o);
        (loader_json(&o), text)
    };
    let signed_a = [("OFFLOAD_CACHE_REMOTE_KEY_FILE", key_a.to_str().unwrap())];
    let signed_b = [("OFFLOAD_CACHE_REMOTE_KEY_FILE", key_b.to_str().unwrap())];
    let (r, _) = run("refused-0", one, &signed_a);
    assert_eq!(r["compiles"], 1, "{r}");
    let name = the_value(&redis);
    let good = get_raw(&redis, &name);

    // Signed with another key: refused with a warning naming the value, compiled, replaced.
    let (r, text) = run("refused-1", one, &signed_b);
    assert_eq!(
        (r["remote_refused"].as_u64(), r["compiles"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    assert!(
        text.contains("MAC does not match") && text.contains(&name),
        "{text}"
    );
    assert_ne!(get_raw(&redis, &name), good, "replaced by key b's value");
    // The value key b signed is refused under key a, and the other way round.
    let (r, _) = run("refused-2", one, &signed_a);
    assert_eq!(r["remote_refused"], 1, "{r}");
    let (r, _) = run("refused-3", one, &signed_a);
    assert_eq!(r["remote_hits"], 1, "replaced by a good value again: {r}");

    // Unsigned (written by a process without a key file): refused where signing is on.
    let (r, _) = run("refused-4", one, &[]);
    assert_eq!(
        r["remote_hits"], 1,
        "a reader without a key reads signed values: {r}"
    );
    redis.cli(&["DEL", &name]);
    let (r, _) = run("refused-5", one, &[]);
    assert_eq!(r["compiles"], 1, "{r}");
    let (r, text) = run("refused-6", one, &signed_a);
    assert_eq!(
        (r["remote_refused"].as_u64(), r["compiles"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    assert!(text.contains("not signed"), "{text}");

    // Corrupted: every one of these is refused and the result is still right.
    let good = get_raw(&redis, &name);
    let mut seed = 7u64;
    for round in 0..6 {
        let mut bad = good.clone();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        match round % 3 {
            0 => {
                let i = (seed as usize >> 8) % bad.len();
                bad[i] ^= 0x40;
            }
            1 => bad.truncate((seed as usize >> 8) % bad.len()),
            _ => bad.extend_from_slice(b"tail"),
        }
        set_raw(&redis, &name, &bad);
        let (r, _) = run(&format!("refused-c{round}"), one, &signed_a);
        assert_eq!(r["remote_refused"], 1, "round {round}: {r}");
        assert_eq!(r["failures"], 0, "round {round}: {r}");
    }

    // Another key's value copied under this name.
    let (r, _) = run("refused-7", two, &signed_a);
    assert_eq!(r["failures"], 0, "{r}");
    let entries = redis.keys("offload-jit:entry:*");
    assert_eq!(entries.len(), 2);
    let other = entries.iter().find(|k| **k != name).unwrap();
    set_raw(&redis, &name, &get_raw(&redis, other));
    let (r, _) = run("refused-8", one, &signed_a);
    assert_eq!(r["remote_refused"], 1, "{r}");
    let (r, _) = run("refused-9", one, &[]);
    assert_eq!(r["remote_hits"], 1, "replaced: {r}");
}

#[test]
fn a_redis_that_is_down_stopped_full_or_garbage_costs_only_time() {
    // Nothing listens there.
    let gone = scratch("redis-gone").join("nobody.sock");
    let (r, text) = load_output(
        2,
        &node_env("down-0", &format!("redis+unix://{}", gone.display())),
    );
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(
        text.matches("JIT remote cache").count(),
        1,
        "one warning per process: {text}"
    );
    assert!(text.contains("nobody.sock"), "names the server: {text}");

    // Stopped (SIGSTOP): connections are accepted by the kernel, nothing answers.
    let redis = Redis::start("stopped", &[]);
    redis.signal(libc::SIGSTOP);
    let started = Instant::now();
    let (r, text) = load_output(
        2,
        &with(
            node_env("down-1", &redis.url),
            &[("OFFLOAD_CACHE_REMOTE_TIMEOUT", "300")],
        ),
    );
    redis.signal(libc::SIGCONT);
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(text.matches("JIT remote cache").count(), 1, "{text}");
    assert!(text.contains("no answer in"), "says it timed out: {text}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );

    // Full: maxmemory with noeviction answers OOM to every write.
    let full = Redis::start("full", &["maxmemory 1", "maxmemory-policy noeviction"]);
    let (r, text) = load_output(1, &node_env("down-2", &full.url));
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert!(text.contains("OOM"), "names the error: {text}");
    assert!(full.keys("offload-jit:*").is_empty());

    // A server that answers garbage.
    let sock = scratch("redis-garbage").join("garbage.sock");
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(b"%%garbage\x00\xff\r\n:x\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (r, text) = load_output(
        1,
        &node_env("down-3", &format!("redis+unix://{}", sock.display())),
    );
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(text.matches("JIT remote cache").count(), 1, "{text}");
}

#[test]
fn tls_with_a_self_signed_certificate_and_a_password_from_a_file() {
    let dir = scratch("redis").join("tls");
    std::fs::create_dir_all(&dir).unwrap();
    // A self-signed certificate authority and the server's certificate it signs (webpki, which
    // rustls checks with, takes no CA certificate as the server's own).
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let o = Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("openssl (scripts/setup.sh installs it)");
        assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=offload test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "req.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
    // A free port: bound, then released for the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let secret = "s3cret with spaces";
    let lines = vec![
        "port 0".to_string(),
        format!("tls-port {port}"),
        "bind 127.0.0.1".into(),
        format!("tls-cert-file {}", cert.display()),
        format!("tls-key-file {}", key.display()),
        format!("tls-ca-cert-file {}", ca.display()),
        "tls-auth-clients no".into(),
        format!("requirepass \"{secret}\""),
        format!("dir {}", dir.display()),
        "save \"\"".into(),
    ];
    let cli = vec![
        "--tls".to_string(),
        "--cacert".into(),
        ca.display().to_string(),
        "-h".into(),
        "localhost".into(),
        "-p".into(),
        port.to_string(),
        "--no-auth-warning".into(),
        "-a".into(),
        secret.into(),
    ];
    let url = format!("rediss://localhost:{port}");
    let redis = Redis::run(dir.clone(), lines, url.clone(), cli);
    let password = dir.join("password");
    std::fs::write(&password, format!("{secret}\n")).unwrap();
    let env = |tag: &str| {
        with(
            node_env(tag, &url),
            &[
                ("OFFLOAD_CACHE_REMOTE_CA_FILE", ca.to_str().unwrap()),
                (
                    "OFFLOAD_CACHE_REMOTE_PASSWORD_FILE",
                    password.to_str().unwrap(),
                ),
            ],
        )
    };
    let (r, text) = load_output(1, &env("tls-a"));
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["remote_errors"], 0, "{r}: {text}");
    let r = load(1, &env("tls-b"));
    assert_eq!(r["remote_hits"], 4, "{r}");
    assert_eq!(redis.keys("offload-jit:entry:*").len(), 4);
    // Without the password: refused by the server, one warning, compiled.
    let (r, text) = load_output(
        1,
        &with(
            node_env("tls-c", &url),
            &[("OFFLOAD_CACHE_REMOTE_CA_FILE", ca.to_str().unwrap())],
        ),
    );
    assert_eq!(r["compiles"], 4, "{r}");
    assert!(text.contains("JIT remote cache"), "{text}");
    assert!(!text.contains(secret));
}

#[test]
fn remote_variables_are_checked() {
    for (k, v, says) in [
        ("OFFLOAD_CACHE_REMOTE", "http://example", "not a Redis URL"),
        (
            "OFFLOAD_CACHE_REMOTE_TIMEOUT",
            "0",
            "OFFLOAD_CACHE_REMOTE_TIMEOUT",
        ),
        (
            "OFFLOAD_CACHE_REMOTE_KEY_FILE",
            "/nonexistent/key",
            "OFFLOAD_CACHE_REMOTE_KEY_FILE",
        ),
        ("OFFLOAD_CACHE_REMOTE_NAMESPACE", "a b", "namespace"),
    ] {
        let mut env = node_env("vars", "redis+unix:///nonexistent.sock");
        env.retain(|(n, _)| *n != k);
        env.push((k, v.to_string()));
        let image = &which_images()[0].0;
        let args = which_run_args(image);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let pairs: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let o = offload(&args, &pairs);
        assert!(!o.status.success(), "{k}={v}");
        assert!(stderr(&o).contains(says), "{k}={v}: {}", stderr(&o));
    }
}

#[test]
fn a_redis_killed_mid_compile_and_a_read_only_replica_cost_only_time() {
    // Killed while a process holds the lock and compiles: its store fails with one warning,
    // and its results are right.
    let mut redis = Redis::start("killed-mid-run", &[]);
    let worker = slow_worker();
    let images = which_images();
    let env = with(
        node_env("mid-0", &redis.url),
        &[("OFFLOAD_JIT_WORKER", worker.to_str().unwrap())],
    );
    let child = run_loader(1, &images[..1], &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while redis.keys("offload-jit:lock:*").is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "no lock taken");
        std::thread::sleep(Duration::from_millis(10));
    }
    redis.stop();
    let o = child.wait_with_output().unwrap();
    let text = stderr(&o);
    let r = loader_json(&o);
    assert_eq!(r["compiles"], 1, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(text.matches("JIT remote cache").count(), 1, "{text}");

    // A read-only replica: its values are read (a plain GET); a miss there (the lock is a
    // write) is one warning and a compile.
    let port = |l: std::net::TcpListener| l.local_addr().unwrap().port();
    let p1 = port(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let primary = Redis::start_tcp("primary", p1, &[]);
    let first = load(1, &node_env("replica-0", &primary.url));
    assert_eq!(first["compiles"], 4, "{first}");
    let p2 = port(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let replica = Redis::start_tcp("replica", p2, &[&format!("replicaof 127.0.0.1 {p1}")]);
    let synced = Instant::now();
    while replica.keys("offload-jit:entry:*").len() < 4 {
        assert!(
            synced.elapsed() < Duration::from_secs(20),
            "the replica did not sync"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = load(1, &node_env("replica-1", &replica.url));
    assert_eq!(r["remote_hits"], 4, "{r}");
    primary.cli(&["FLUSHALL"]);
    while !replica.keys("offload-jit:entry:*").is_empty() {
        assert!(
            synced.elapsed() < Duration::from_secs(40),
            "the replica did not sync"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (r, text) = load_output(1, &node_env("replica-2", &replica.url));
    assert_eq!(r["compiles"], 4, "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert!(
        text.contains("read only replica"),
        "names the error: {text}"
    );
    assert_eq!(text.matches("JIT remote cache").count(), 1, "{text}");
}
