//! The JIT's disk cache across processes: a warm process compiles nothing, starts no worker and
//! maps no LLVM; bad entries are found, removed and compiled again; processes that miss on one
//! key together compile it once; the size cap holds and pruning deletes only the cache's own
//! files; untrusted and unusable directories never fail a compile; the variables are checked.
//!
//! (The workspace's `.cargo/config.toml` turns the cache off for everything cargo runs; each
//! test here turns it on with a directory of its own.)

use offload_tests::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh cache directory (not created: the cache makes it).
fn cache_dir(tag: &str) -> PathBuf {
    scratch("disk-cache").join(tag)
}

fn cache_env(dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("OFFLOAD_CACHE", "1".into()),
        ("OFFLOAD_CACHE_DIR", dir.display().to_string()),
    ]
}

fn offload_env(args: &[&str], env: &[(&str, String)]) -> Output {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    offload(args, &pairs)
}

/// `offload run --json` of variant_a's bitcode, dumping its output into `dump`.
fn run_which(image: &Path, dump: &Path, env: &[(&str, String)]) -> (Value, String) {
    std::fs::create_dir_all(dump).unwrap();
    let mut args = which_run_args(image);
    args.extend(["--dump", dump.to_str().unwrap(), "--json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = offload_env(&args, env);
    assert!(o.status.success(), "{}", stderr(&o));
    (serde_json::from_slice(&o.stdout).unwrap(), stderr(&o))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "entry"))
        .collect();
    v.sort();
    v
}

fn list_json(env: &[(&str, String)]) -> Value {
    let o = offload_env(&["cache", "list", "--json"], env);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".lock") || n.starts_with(".tmp-"))
        .collect()
}

#[test]
fn a_warm_process_compiles_nothing_starts_no_worker_and_maps_no_llvm() {
    let dir = cache_dir("warm");
    let env = cache_env(&dir);
    let imgs = which_images();
    let cold = loader_json(&run_loader(1, &imgs, &env).output().unwrap());
    assert_eq!(cold["compiles"], 4, "{cold}");
    assert_eq!(cold["worker_started"], true, "{cold}");
    let warm = loader_json(&run_loader(2, &imgs, &env).output().unwrap());
    assert_eq!(warm["compiles"], 0, "{warm}");
    assert_eq!(warm["disk_hits"], 4, "{warm}");
    assert_eq!(warm["worker_started"], false, "{warm}");
    assert_eq!(warm["llvm_mapped"], false, "{warm}");
    assert_eq!(warm["failures"], 0, "{warm}");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // The command line says so too, and the results are the same bytes.
    let scratch = scratch("disk-cache-run");
    let (first, _) = run_which(&imgs[0].0, &scratch.join("1"), &env);
    let (second, _) = run_which(&imgs[0].0, &scratch.join("2"), &env);
    assert_eq!(first["jit"]["disk_hits"], 1, "{first}");
    assert_eq!(second["jit"]["disk_hits"], 1, "{second}");
    assert_eq!(second["jit"]["compiles"], 0, "{second}");
    assert_eq!(second["jit"]["worker_started"], false, "{second}");
    assert_eq!(
        std::fs::read(scratch.join("1/arg0.bin")).unwrap(),
        std::fs::read(scratch.join("2/arg0.bin")).unwrap()
    );
    // Another toolchain (here: a worker executable with different contents, as after an
    // upgrade) makes other keys: compiled again, not served a stale entry.
    let worker = scratch.join("offload-jit-worker");
    let mut bytes = std::fs::read(build_dir().join("offload-jit-worker")).unwrap();
    bytes.push(0);
    std::fs::write(&worker, bytes).unwrap();
    std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut upgraded = env.clone();
    upgraded.push(("OFFLOAD_JIT_WORKER", worker.display().to_string()));
    let (third, _) = run_which(&imgs[0].0, &scratch.join("3"), &upgraded);
    assert_eq!(third["jit"]["compiles"], 1, "{third}");
    assert_eq!(third["jit"]["disk_hits"], 0, "{third}");
    let (fourth, _) = run_which(&imgs[0].0, &scratch.join("4"), &upgraded);
    assert_eq!(fourth["jit"]["disk_hits"], 1, "{fourth}");

    let info = offload_env(&["info", "--json"], &env);
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["jit"]["disk_cache"]["entries"], 5, "{info}");
    assert_eq!(info["jit"]["disk_cache"]["mode"], "read-write", "{info}");

    // The GPU targets' images (PTX or a cubin; an AMD code object) are kept the same way.
    for (kernel, target, cpu) in [
        ("saxpy", NVPTX, "sm_90"),
        ("saxpy", "amdgcn-amd-amdhsa", "gfx90a"),
    ] {
        let input = if target == NVPTX {
            nvptx_bitcode(kernel, cpu)
        } else {
            amdgcn_bitcode(kernel, cpu)
        };
        let out = scratch.join(format!("{cpu}.img"));
        let args = [
            "jit",
            input.to_str().unwrap(),
            "--target",
            target,
            "--cpu",
            cpu,
            "-o",
            out.to_str().unwrap(),
            "--json",
        ];
        let a = offload_env(&args, &env);
        assert!(a.status.success(), "{}", stderr(&a));
        let first_bytes = std::fs::read(&out).unwrap();
        let b = offload_env(&args, &env);
        assert!(b.status.success(), "{}", stderr(&b));
        let a: Value = serde_json::from_slice(&a.stdout).unwrap();
        let b: Value = serde_json::from_slice(&b.stdout).unwrap();
        assert_eq!(a["served"], "compiled", "{a}");
        assert_eq!(b["served"], "disk", "{b}");
        assert_eq!(std::fs::read(&out).unwrap(), first_bytes, "{target}");
    }
}

#[test]
fn bad_entries_are_found_removed_and_compiled_again() {
    let image = &which_images()[0].0;
    let scratch = scratch("disk-cache-bad");
    for (n, what) in [
        "truncated",
        "flipped byte",
        "wrong key",
        "old schema",
        "empty",
    ]
    .iter()
    .enumerate()
    {
        let dir = cache_dir(&format!("bad-{n}"));
        let env = cache_env(&dir);
        let (first, _) = run_which(image, &scratch.join(format!("{n}a")), &env);
        assert_eq!(first["jit"]["compiles"], 1);
        let path = entries(&dir).pop().unwrap();
        let good = std::fs::read(&path).unwrap();
        let bad = match *what {
            "truncated" => good[..good.len() - 100].to_vec(),
            "flipped byte" => {
                let mut b = good.clone();
                b[good.len() / 2] ^= 0x10;
                b
            }
            "wrong key" => {
                // An entry of another image under this one's name.
                let other = cache_dir(&format!("bad-{n}-other"));
                run_which(
                    &which_images()[1].0,
                    &scratch.join(format!("{n}o")),
                    &cache_env(&other),
                );
                std::fs::read(entries(&other).pop().unwrap()).unwrap()
            }
            "old schema" => {
                let mut b = good.clone();
                b[8..12].copy_from_slice(&0u32.to_le_bytes());
                let n = b.len() - 32;
                let d = blake3_of(&b[..n]);
                b[n..].copy_from_slice(&d);
                b
            }
            _ => Vec::new(),
        };
        std::fs::write(&path, &bad).unwrap();
        let (again, err) = run_which(image, &scratch.join(format!("{n}b")), &env);
        assert_eq!(again["jit"]["compiles"], 1, "{what}: {again}");
        assert_eq!(again["jit"]["disk_hits"], 0, "{what}: {again}");
        let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
        assert_eq!(warnings.len(), 1, "{what}: {err}");
        assert!(
            warnings[0].contains(path.file_name().unwrap().to_str().unwrap()),
            "{what}: {err}"
        );
        assert_eq!(
            std::fs::read(scratch.join(format!("{n}a/arg0.bin"))).unwrap(),
            std::fs::read(scratch.join(format!("{n}b/arg0.bin"))).unwrap(),
            "{what}"
        );
        // Written again, whole.
        assert_eq!(std::fs::read(&path).unwrap(), good, "{what}");
        let list = list_json(&env);
        assert!(list["entries"][0]["error"].is_null(), "{what}: {list}");
    }
}

/// The entries' digest (to re-seal an entry whose schema field was changed, as an entry of
/// another version would be).
fn blake3_of(bytes: &[u8]) -> [u8; 32] {
    offload_jit_client::disk::digest(bytes)
}

/// Four processes of four threads each load the same four images into an empty directory:
/// four compiles in all. (This test failed once, in 2026-12, with its message lost; it then
/// passed 285 runs in a row with both cores busy with a release build. So that a failure
/// explains itself, every loader's JIT log (`OFFLOAD_INFO=jit`: each request, served from
/// memory, disk or a compile, with its key) and the directory's listing go into every
/// assertion's message.)
#[test]
fn processes_that_miss_together_compile_each_key_once() {
    let dir = cache_dir("many");
    let mut env = cache_env(&dir);
    env.push(("OFFLOAD_INFO", "jit".into()));
    let imgs = which_images();
    let children: Vec<_> = (0..4)
        .map(|_| {
            run_loader(4, &imgs, &env)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let listing = |dir: &Path| -> String {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| {
                        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                        format!("{} ({len} bytes)", e.file_name().to_string_lossy())
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names.join(", ")
    };
    let diagnostics = || {
        let mut d = format!("\ndirectory: {}\n", listing(&dir));
        for (i, o) in outputs.iter().enumerate() {
            d.push_str(&format!(
                "--- loader {i} ({}): {}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        d
    };
    let results: Vec<Value> = outputs
        .iter()
        .map(|o| {
            assert!(o.status.success(), "a loader failed:{}", diagnostics());
            serde_json::from_slice(&o.stdout).unwrap()
        })
        .collect();
    let compiles: u64 = results
        .iter()
        .map(|r| r["compiles"].as_u64().unwrap())
        .sum();
    assert_eq!(compiles, 4, "one compile per key in all:{}", diagnostics());
    for r in &results {
        assert_eq!(r["failures"], 0, "{r}:{}", diagnostics());
    }
    assert_eq!(entries(&dir).len(), 4, "{}", diagnostics());
    let list = list_json(&env);
    for e in list["entries"].as_array().unwrap() {
        assert!(e["error"].is_null(), "{e}:{}", diagnostics());
    }
    assert!(
        leftovers(&dir).is_empty(),
        "{:?}:{}",
        leftovers(&dir),
        diagnostics()
    );
}

#[test]
fn the_size_cap_holds_and_pruning_deletes_only_the_caches_files() {
    let dir = cache_dir("cap");
    let mut env = cache_env(&dir);
    let imgs = which_images();
    loader_json(&run_loader(1, &imgs, &env).output().unwrap());
    let sizes: Vec<u64> = entries(&dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    let total: u64 = sizes.iter().sum();
    let foreign = [
        dir.join("README"),
        dir.join(format!("{}.entry", "0".repeat(64))),
    ];
    for f in &foreign {
        std::fs::write(f, vec![7u8; 100_000]).unwrap();
    }
    // `offload info` counts entries from the directory listing, with no stat or read (so it
    // stays fast on a big cache): the foreign file named like an entry counts there. `offload
    // cache stats` checks each file's magic: it counts only the cache's own.
    let info = offload_env(&["info", "--json"], &env);
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["jit"]["disk_cache"]["entries"], 5, "{info}");
    let stats = offload_env(&["cache", "stats", "--json"], &env);
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["entries"], 4, "{stats}");
    assert_eq!(stats["other_files"], 2, "{stats}");
    // A cap of half: prune deletes the least recently used down to 90 % of it.
    let cap = total / 2;
    env.push(("OFFLOAD_CACHE_MAX_SIZE", cap.to_string()));
    let o = offload_env(&["cache", "prune"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("pruned"), "{}", stdout(&o));
    let left: u64 = entries(&dir)
        .iter()
        .filter(|p| !foreign.contains(p))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(left <= cap, "{left} > {cap}");
    for f in &foreign {
        assert!(f.exists(), "{} was deleted", f.display());
    }
    // The cap also holds by itself as entries are written.
    let dir2 = cache_dir("cap-auto");
    let mut env2 = cache_env(&dir2);
    env2.push(("OFFLOAD_CACHE_MAX_SIZE", cap.to_string()));
    loader_json(&run_loader(1, &imgs, &env2).output().unwrap());
    let left: u64 = entries(&dir2)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(left <= cap, "{left} > {cap}");
    // clear: every entry, nothing else.
    let o = offload_env(&["cache", "clear"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        entries(&dir).len(),
        1,
        "only the foreign '.entry' file is left"
    );
    for f in &foreign {
        assert!(f.exists());
    }
}

#[test]
fn untrusted_and_unusable_directories_never_fail_a_compile() {
    use std::os::unix::fs::PermissionsExt;
    let image = &which_images()[0].0;
    let scratch = scratch("disk-cache-trust");
    let dir = cache_dir("trust");
    let env = cache_env(&dir);
    run_which(image, &scratch.join("a"), &env);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (r, err) = run_which(image, &scratch.join("b"), &env);
    assert_eq!(r["jit"]["disk_hits"], 0, "{r}");
    assert_eq!(r["jit"]["compiles"], 1, "{r}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("OFFLOAD_CACHE_TRUST"), "{err}");
    let mut trusting = env.clone();
    trusting.push(("OFFLOAD_CACHE_TRUST", "1".into()));
    let (r, err) = run_which(image, &scratch.join("c"), &trusting);
    assert_eq!(r["jit"]["disk_hits"], 1, "{r}: {err}");

    // A path that cannot be a directory, and a read-only filesystem.
    let file = scratch.join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [file.join("cache"), PathBuf::from("/proc/offload-cache")] {
        let (r, err) = run_which(image, &scratch.join("d"), &cache_env(&bad));
        assert_eq!(r["jit"]["compiles"], 1, "{r}");
        assert_eq!(err.lines().count(), 1, "{}: {err}", bad.display());
        assert!(err.contains("warning: JIT disk cache"), "{err}");
    }

    // Read-only: read, never written.
    let mut ro = env.clone();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    ro.push(("OFFLOAD_CACHE", "read-only".into()));
    let before = entries(&dir).len();
    let (r, _) = run_which(image, &scratch.join("e"), &ro);
    assert_eq!(r["jit"]["disk_hits"], 1, "{r}");
    let (r, _) = run_which(&which_images()[3].0, &scratch.join("f"), &ro);
    assert_eq!(r["jit"]["compiles"], 1, "{r}");
    assert_eq!(entries(&dir).len(), before);
}

/// splitmix64
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bad values of the cache's variables are one-line errors naming the variable; random values
/// never crash `offload` (seeded; `OFFLOAD_TEST_SEED` reruns one).
#[test]
fn cache_variables_are_checked() {
    let image = &which_images()[0].0;
    let dir = cache_dir("vars");
    for (var, value) in [
        ("OFFLOAD_CACHE", "maybe"),
        ("OFFLOAD_CACHE_MAX_SIZE", "12Q"),
        ("OFFLOAD_CACHE_MAX_SIZE", "0"),
        ("OFFLOAD_CACHE_TRUST", "perhaps"),
    ] {
        let mut env = cache_env(&dir);
        env.push((var, value.into()));
        let o = offload_env(&["cache", "stats"], &env);
        assert_eq!(o.status.code(), Some(2), "{var}={value}");
        assert!(stderr(&o).contains(var), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        let o = offload_env(
            &[
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "which",
                "--arg",
                "buf:u32:1",
            ],
            &env,
        );
        assert_eq!(o.status.code(), Some(1), "{var}={value}");
        assert!(stderr(&o).contains(var), "{}", stderr(&o));
    }
    let seed: u64 = std::env::var("OFFLOAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xcac4e);
    let mut s = seed;
    let pieces = [
        "",
        "0",
        "1",
        "on",
        "off",
        "read-only",
        "RO",
        "-1",
        "1K",
        "99999999999999999999T",
        "1 G",
        "/",
        "..",
        "\u{7f}",
        " ",
        "\t1",
        "yes",
        "g",
        "1.5M",
        "/dev/null",
        "/proc/self",
    ];
    let vars = [
        "OFFLOAD_CACHE",
        "OFFLOAD_CACHE_DIR",
        "OFFLOAD_CACHE_MAX_SIZE",
        "OFFLOAD_CACHE_TRUST",
    ];
    for i in 0..40 {
        let mut cmd = Command::new(offload_bin());
        cmd.args(["cache", "stats", "--json"]);
        cmd.env("OFFLOAD_CACHE_DIR", dir.join(format!("m{i}")));
        for v in vars {
            if next(&mut s) % 2 == 0 {
                let a = pieces[(next(&mut s) % pieces.len() as u64) as usize];
                let b = pieces[(next(&mut s) % pieces.len() as u64) as usize];
                cmd.env(v, format!("{a}{b}"));
            }
        }
        let o = cmd.output().unwrap();
        let code = o.status.code();
        assert!(
            matches!(code, Some(0) | Some(1) | Some(2)),
            "seed {seed}, case {i}: {code:?}: {}",
            stderr(&o)
        );
        if code != Some(0) {
            let e = stderr(&o);
            assert_eq!(e.lines().count(), 1, "seed {seed}, case {i}: {e}");
            assert!(e.contains("OFFLOAD_CACHE") || e.contains("HOME"), "{e}");
        }
    }
}
