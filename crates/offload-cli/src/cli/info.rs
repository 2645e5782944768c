//! `offload info [--json]`

use super::out::outln;
use super::{Failure, human_bytes};
use offload::{PluginStatus, Runtime};
use offload_core::text::printable;
use serde_json::json;

pub fn info(as_json: bool) -> Result<(), Failure> {
    let rt = Runtime::from_env().map_err(Failure::input)?;
    let mut plugins = Vec::new();
    for slot in rt.plugins() {
        let status = slot.status();
        let mut devices = Vec::new();
        if let PluginStatus::Ok(n) = status {
            for i in 0..n {
                let entry = match slot.device(i).and_then(|d| Ok((d.kind(), d.info()?))) {
                    Ok((kind, info)) => json!({
                        "index": i,
                        "kind": kind.to_string(),
                        "name": info.name,
                        "compute_unit": info.compute_unit_kind,
                        "target_features": info.target_features,
                        "memory_bytes": info.total_memory,
                        "compute_units": info.compute_units,
                        "max_threads_per_block": info.limits.max_threads_per_block,
                        "max_block": info.limits.max_block,
                        "max_grid": info.limits.max_grid,
                        "warp_size": info.limits.warp_size,
                    }),
                    Err(e) => json!({"index": i, "error": e.to_string()}),
                };
                devices.push(entry);
            }
        }
        plugins.push(json!({
            "name": slot.name(),
            "path": slot.path().display().to_string(),
            "status": status.label(),
            "reason": status.reason(),
            "abi_version": slot.abi_version().map(|(a, b)| format!("{a}.{b}")),
            "build_id": slot.build_id(),
            "elf_machine": slot.elf_machine(),
            "target_triple": slot.target_triple(),
            "serves": slot.image_claims().map(|c| c.iter().map(|c| c.to_text()).collect::<Vec<_>>()),
            "properties": slot.properties().map(|p| p.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect::<serde_json::Map<String, serde_json::Value>>()),
            "jit": slot.jit_stats().map(|j| json!({
                "compiles": j.compiles,
                "memory_hits": j.memory_hits,
                "shared_waits": j.shared_waits,
                "misses": j.misses,
                "failures": j.failures,
                "compile_ms": j.compile_ns as f64 / 1e6,
                "entries": j.entries,
                "bytes": j.bytes,
                "evictions": j.evictions,
            })),
            "devices": devices,
        }));
    }
    // The JIT as this process would use it: where its worker is (nothing is started here).
    let client = rt.jit();
    let jit = match client.config() {
        Ok(config) => {
            let (isolation, name) = match config.isolation {
                offload_jit_client::Isolation::Worker => {
                    ("worker", offload_jit_client::WORKER_NAME)
                }
                offload_jit_client::Isolation::InProcess => {
                    ("inprocess", offload_jit_client::ENGINE_LIBRARY)
                }
            };
            let located = client.locate(name);
            let disk = client.disk();
            let d = disk.config();
            let summary = (d.mode != offload_jit_client::DiskMode::Off && d.dir.is_dir())
                .then(|| disk.count_by_name().ok())
                .flatten();
            let stats = disk.stats();
            let disk_json = json!({
                "mode": d.mode.name(),
                "dir": d.dir.display().to_string(),
                "max_bytes": d.max_size,
                "trust": d.trust,
                "note": d.note,
                "entries": summary.as_ref().map(|s| s.entries),
                "locks": summary.as_ref().map(|s| s.locks),
                "temporaries": summary.as_ref().map(|s| s.temporaries),
                "hits": stats.hits,
                "misses": stats.misses,
                "writes": stats.writes,
                "bad_entries": stats.bad_entries,
            });
            // The limits a worker started now would get (resolved against this process's).
            let limits = match config.limits.resolve() {
                Ok(applied) => {
                    let mut m = serde_json::Map::new();
                    for a in &applied {
                        m.insert(
                            a.resource.key().into(),
                            json!({"value": a.value, "source": a.source, "variable": a.resource.variable()}),
                        );
                    }
                    serde_json::Value::Object(m)
                }
                Err(e) => json!({ "error": e.to_string() }),
            };
            let memory_limit = limits["address_space"]["value"].clone();
            let remote_json = config.remote.as_ref().map(|c| {
                json!({
                    "server": c.server,
                    "namespace": c.namespace,
                    "signed": c.mac_key.is_some(),
                    "max_value": c.max_value,
                })
            });
            json!({
                "disk_cache": disk_json,
                "remote_cache": remote_json,
                "limits": limits,
                "isolation": isolation,
                "path": located.as_ref().ok().map(|p| p.display().to_string()),
                "llvm": offload_jit_client::LLVM_VERSION,
                "timeout_s": config.timeout.as_ref().map(|t| t.value.as_secs_f64()),
                "memory_limit_bytes": memory_limit,
                "error": located.err().map(|e| e.to_string()),
            })
        }
        Err(e) => json!({ "error": e.to_string() }),
    };
    if as_json {
        let out = json!({ "plugins": plugins, "jit": jit, "notes": rt.notes() });
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).expect("JSON values serialise")
        );
        return Ok(());
    }
    if plugins.is_empty() {
        outln!(
            "no plugins found (searched OFFLOAD_PLUGIN_PATH, the executable's directory and ../lib)"
        );
    }
    for p in &plugins {
        // Plugin-supplied text is printed with control characters escaped: a name or reason
        // with a newline cannot forge a line of this report.
        let s = |k: &str| printable(p[k].as_str().unwrap_or("-")).into_owned();
        outln!("plugin {:<10} {:<10} {}", s("name"), s("status"), s("path"));
        if p["elf_machine"].is_u64() {
            let serves: Vec<String> = p["serves"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str().and_then(offload_core::ImageClaim::from_text))
                .map(|c| c.describe())
                .collect();
            outln!("    ABI {}, serves {}", s("abi_version"), serves.join(", "));
        }
        for (k, v) in p["properties"].as_object().into_iter().flatten() {
            outln!(
                "    {}: {}",
                printable(k),
                printable(v.as_str().unwrap_or("?"))
            );
        }
        if let Some(r) = p["reason"].as_str() {
            outln!("    reason: {}", printable(r));
        }
        for d in p["devices"].as_array().into_iter().flatten() {
            if let Some(e) = d["error"].as_str() {
                outln!("    {}:{}  error: {}", s("name"), d["index"], printable(e));
                continue;
            }
            outln!(
                "    {}:{}  {} ({})  compute unit {}  memory {}",
                s("name"),
                d["index"],
                printable(d["name"].as_str().unwrap_or("?")),
                d["kind"].as_str().unwrap_or("?"),
                printable(d["compute_unit"].as_str().unwrap_or("?")),
                human_bytes(d["memory_bytes"].as_u64().unwrap_or(0))
            );
            let dims = |v: &serde_json::Value| {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join("x")
                    })
                    .unwrap_or_default()
            };
            outln!(
                "          {} compute units, warp {}, up to {} threads per block, block up to {}, grid up to {}",
                d["compute_units"],
                d["warp_size"],
                d["max_threads_per_block"],
                dims(&d["max_block"]),
                dims(&d["max_grid"])
            );
        }
    }
    match (jit["error"].as_str(), jit["path"].as_str()) {
        (Some(e), _) => outln!("jit      error: {}", printable(e)),
        (None, Some(path)) => outln!(
            "jit      {} {path} (LLVM {}; started on the first compile)",
            jit["isolation"].as_str().unwrap_or("?"),
            jit["llvm"].as_str().unwrap_or("?")
        ),
        (None, None) => {}
    }
    if let Some(e) = jit["limits"]["error"].as_str() {
        outln!("         limits: error: {}", printable(e));
    } else if let Some(limits) = jit["limits"]
        .as_object()
        .filter(|_| jit["isolation"] == "worker")
    {
        // (In-process compiles run under this process's own limits.)
        for l in offload_jit_client::limits::RESOURCES {
            let v = &limits[l.key()];
            outln!(
                "         {:<13} {} ({})",
                l.noun(),
                l.show(v["value"].as_u64()),
                printable(v["source"].as_str().unwrap_or("?"))
            );
        }
    }
    let d = &jit["disk_cache"];
    if let Some(mode) = d["mode"].as_str() {
        match (mode, d["entries"].as_u64()) {
            ("off", _) => outln!(
                "cache    off{}",
                d["note"]
                    .as_str()
                    .map(|n| format!(": {}", printable(n)))
                    .unwrap_or_default()
            ),
            (_, Some(n)) => outln!(
                "cache    {} ({mode}), {n} entr{}, cap {} (sizes: offload cache stats)",
                printable(d["dir"].as_str().unwrap_or("?")),
                if n == 1 { "y" } else { "ies" },
                human_bytes(d["max_bytes"].as_u64().unwrap_or(0))
            ),
            (_, None) => outln!(
                "cache    {} ({mode}), not created yet",
                printable(d["dir"].as_str().unwrap_or("?"))
            ),
        }
    }
    let r = &jit["remote_cache"];
    if let Some(server) = r["server"].as_str() {
        outln!(
            "remote   {} (namespace '{}'), {}",
            printable(server),
            printable(r["namespace"].as_str().unwrap_or("?")),
            if r["signed"].as_bool() == Some(true) {
                "signed entries only"
            } else {
                "UNSIGNED: anyone who can write to it can run code in this process \
                 (OFFLOAD_CACHE_REMOTE_KEY_FILE)"
            }
        );
    }
    for n in rt.notes() {
        outln!("note: {}", printable(n));
    }
    Ok(())
}
