//! The plugin ABI as the runtime sees it: a new backend crate (testdev) is found through
//! OFFLOAD_PLUGIN_PATH, loaded and routed to; damaged tables, panicking constructors and
//! failing initialisation are reported with their reason while the other plugins keep working.

use offload::{Error, KernelArg, LaunchDims, Runtime};
use offload_core::abi::loader::check_table;
use offload_core::abi::{ABI_MAGIC, ABI_MAJOR, ABI_MINOR, PluginTable};
use offload_tests::*;

const TESTDEV_MACHINE: u16 = 0x7E57;

fn both_runtime() -> Runtime {
    Runtime::with_plugin_dirs(&[testdev_plugin_dir(), host_plugin_dir()], None)
}

fn info_json(envs: &[(&str, &str)]) -> serde_json::Value {
    let dir = testdev_plugin_dir();
    let mut all = vec![("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap())];
    all.extend_from_slice(envs);
    let out = offload(&["info", "--json"], &all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn plugin<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("plugin {name} missing from {json}"))
}

#[test]
fn info_lists_the_test_backend_only_when_its_directory_is_on_the_path() {
    let out = offload(&["info", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let names: Vec<&str> = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"host"), "{names:?}");
    assert!(!names.contains(&"testdev"), "{names:?}");
    let host = plugin(&json, "host");
    assert_eq!(host["status"], "ok");
    assert!(
        !host["devices"][0]["compute_unit"]
            .as_str()
            .unwrap()
            .is_empty()
    );

    let json = info_json(&[]);
    let t = plugin(&json, "testdev");
    assert_eq!(t["status"], "ok");
    assert_eq!(t["abi_version"], format!("{ABI_MAJOR}.{ABI_MINOR}"));
    assert_eq!(t["elf_machine"], TESTDEV_MACHINE);
    assert_eq!(t["devices"].as_array().unwrap().len(), 2);
    assert_eq!(t["devices"][1]["compute_unit"], "test1");
    assert_eq!(plugin(&json, "host")["status"], "ok");

    let text = offload(
        &["info"],
        &[(
            "OFFLOAD_PLUGIN_PATH",
            testdev_plugin_dir().to_str().unwrap(),
        )],
    );
    assert!(
        stdout(&text).contains("testdev:1  testdev virtual device 1"),
        "{}",
        stdout(&text)
    );
}

#[test]
fn offload_plugins_restricts_what_is_loaded() {
    let json = info_json(&[("OFFLOAD_PLUGINS", "testdev")]);
    let names: Vec<&str> = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["testdev"]);
    let json = info_json(&[("OFFLOAD_PLUGINS", "host,cuda")]);
    let names: Vec<&str> = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host"]);
    assert!(
        json["notes"][0].as_str().unwrap().contains("'cuda'"),
        "{json}"
    );
}

#[test]
fn images_for_the_new_backend_are_routed_to_it() {
    let rt = both_runtime();
    let image = synthetic_elf(TESTDEV_MACHINE, &["fill", "panic"]);
    let device = rt.route(&image).unwrap();
    assert_eq!(device.to_string(), "testdev:0");
    let program = device.load(&image).unwrap();
    let k = program.kernel("fill").unwrap();
    let buf = device.alloc_buffer(4 * 12).unwrap();
    program
        .launch(
            k,
            &LaunchDims {
                grid: [2, 1, 1],
                block: [3, 2, 1],
                shared_mem_bytes: 0,
            },
            &[KernelArg::U32(100), KernelArg::Ptr(buf.ptr())],
        )
        .unwrap();
    let mut raw = vec![0u8; 48];
    buf.read(&mut raw).unwrap();
    let got: Vec<u32> = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, (100..112).collect::<Vec<u32>>());

    // A host image in the same runtime still goes to the host plugin.
    let host = std::fs::read(host_kernel("saxpy")).unwrap();
    assert_eq!(rt.route(&host).unwrap().to_string(), "host:0");

    // A panic inside a plugin call is an error; the process and the plugin survive.
    let p = program.kernel("panic").unwrap();
    let e = program
        .launch(p, &LaunchDims::linear(1, 1), &[])
        .unwrap_err();
    assert!(matches!(e, Error::PluginPanic(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("testdev kernel 'panic' was launched"),
        "{e}"
    );
    program
        .launch(k, &LaunchDims::linear(1, 1), &[KernelArg::Ptr(buf.ptr())])
        .unwrap();

    // Through the command as well.
    let dir = scratch("testdev-run");
    let path = dir.join("img.elf");
    std::fs::write(&path, &image).unwrap();
    let out = offload(
        &[
            "run",
            path.to_str().unwrap(),
            "--kernel",
            "fill",
            "--grid",
            "2",
            "--block",
            "4",
            "--arg",
            "u32:7",
            "--arg",
            "buf:u32:8",
            "--json",
        ],
        &[(
            "OFFLOAD_PLUGIN_PATH",
            testdev_plugin_dir().to_str().unwrap(),
        )],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["device"], "testdev:0");
    assert_eq!(
        json["buffers"][0]["head"],
        serde_json::json!([7, 8, 9, 10, 11, 12, 13, 14])
    );
}

#[test]
fn damaged_plugins_are_reported_and_the_others_keep_working() {
    let bad_major = format!(
        "plugin speaks ABI {}.{ABI_MINOR}, this runtime speaks {ABI_MAJOR}.{ABI_MINOR}",
        ABI_MAJOR + 1
    );
    let cases = [
        ("bad-magic", "failed", "table magic is"),
        ("bad-major", "failed", bad_major.as_str()),
        ("short-table", "failed", "plugin table is 64 bytes"),
        ("null-entry", "failed", "returned null"),
        ("panic-entry", "failed", "returned null"),
        ("init-error", "failed", "driver error 999"),
        ("no-devices", "no-devices", "reports 0 devices"),
    ];
    for (mode, status, reason) in cases {
        let json = info_json(&[("OFFLOAD_TESTDEV_MODE", mode)]);
        let t = plugin(&json, "testdev");
        assert_eq!(t["status"], status, "{mode}: {t}");
        assert!(
            t["reason"].as_str().unwrap().contains(reason),
            "{mode}: {t}"
        );
        assert_eq!(
            plugin(&json, "host")["status"],
            "ok",
            "{mode}: host must keep working"
        );
    }
    // A run on the host plugin works while a damaged plugin sits on the path.
    let so = host_kernel("saxpy");
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--arg",
            "i32:1",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:1:fill=3",
            "--arg",
            "buf:f32:1:fill=4",
            "--json",
        ],
        &[
            (
                "OFFLOAD_PLUGIN_PATH",
                testdev_plugin_dir().to_str().unwrap(),
            ),
            ("OFFLOAD_TESTDEV_MODE", "bad-major"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["buffers"][1]["head"][0], 10.0);
}

#[test]
fn an_older_minor_version_is_accepted_without_its_newer_entries() {
    // A plugin built for ABI 1.0 has no jit_stats entry: it loads and works, and the runtime
    // does not call past the end of its table.
    let json = info_json(&[("OFFLOAD_TESTDEV_MODE", "abi-1.0")]);
    let t = plugin(&json, "testdev");
    assert_eq!(t["status"], "ok", "{t}");
    assert_eq!(t["abi_version"], format!("{ABI_MAJOR}.0"));
    assert!(t["jit"].is_null(), "{t}");
    assert_eq!(t["devices"].as_array().unwrap().len(), 2);
    // The host plugin of this build has the entry.
    assert!(plugin(&json, "host")["jit"]["compiles"].is_u64());
}

#[test]
fn a_library_that_is_not_a_plugin_is_reported() {
    let dir = scratch("not-a-plugin");
    std::fs::write(dir.join("liboffload_plugin_junk.so"), b"not a library").unwrap();
    std::fs::copy(
        host_kernel("empty"),
        dir.join("liboffload_plugin_kernel.so"),
    )
    .unwrap();
    let rt = Runtime::with_plugin_dirs(&[dir, host_plugin_dir()], None);
    let status = |name: &str| rt.plugin(name).unwrap().status();
    let junk = status("junk");
    assert_eq!(junk.label(), "failed");
    assert!(
        junk.reason().unwrap().contains("cannot open library"),
        "{junk:?}"
    );
    let kernel = status("kernel");
    assert!(
        kernel
            .reason()
            .unwrap()
            .contains("no entry symbol 'offload_plugin_entry'"),
        "{kernel:?}"
    );
    assert_eq!(status("host").label(), "ok");
}

#[test]
fn header_checks_read_nothing_past_a_bad_field() {
    // A table that is only a header with a wrong magic: the checker must stop at the magic.
    let fake = [0u64; 8];
    // SAFETY: `fake` is 64 readable bytes, more than a header.
    let e = unsafe { check_table(fake.as_ptr() as *const PluginTable, "fake.so".as_ref()) }
        .unwrap_err();
    assert!(matches!(e, Error::AbiMismatch(_)), "{e}");
    assert!(e.to_string().contains("fake.so"), "{e}");
    let mut with_magic = [0u64; 8];
    with_magic[0] = ABI_MAGIC;
    // abi_major = 0 (the next field): refused as a version mismatch.
    // SAFETY: as above.
    let e = unsafe {
        check_table(
            with_magic.as_ptr() as *const PluginTable,
            "fake.so".as_ref(),
        )
    }
    .unwrap_err();
    assert!(e.to_string().contains("plugin speaks ABI 0.0"), "{e}");
    // SAFETY: null is allowed by the contract.
    let e = unsafe { check_table(std::ptr::null(), "fake.so".as_ref()) }.unwrap_err();
    assert!(matches!(e, Error::PluginLoad(_)), "{e}");
}
