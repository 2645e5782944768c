//! Where plugin libraries are looked for, and which are loaded.

use offload_core::Result;
use std::path::{Path, PathBuf};

/// Directories (separated by `:`) searched for plugins before the default ones.
pub const ENV_PLUGIN_PATH: &str = "OFFLOAD_PLUGIN_PATH";
/// Comma-separated plugin names; when set, only these plugins are loaded.
pub const ENV_PLUGINS: &str = "OFFLOAD_PLUGINS";
/// Plugin library file names are `liboffload_plugin_<name>.so`.
pub const PLUGIN_PREFIX: &str = "liboffload_plugin_";
/// See [`PLUGIN_PREFIX`].
pub const PLUGIN_SUFFIX: &str = ".so";

/// `OFFLOAD_PLUGIN_PATH` entries, then the executable's directory, then `../lib` next to it.
pub fn default_plugin_dirs() -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some((_, value)) = offload_core::env::raw(&[ENV_PLUGIN_PATH])? {
        dirs.extend(
            value
                .split(':')
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        );
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("../lib"));
        dirs.insert(dirs.len() - 1, exe_dir);
    }
    Ok(dirs)
}

/// The `OFFLOAD_PLUGINS` filter, if set.
pub fn plugin_filter() -> Result<Option<Vec<String>>> {
    Ok(offload_core::env::raw(&[ENV_PLUGINS])?.map(|(_, v)| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }))
}

/// The short name of a plugin file (`liboffload_plugin_host.so` → `host`).
pub fn plugin_name(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix(PLUGIN_PREFIX)?
        .strip_suffix(PLUGIN_SUFFIX)
        .filter(|n| !n.is_empty())
}

/// Plugin files in `dirs`, first occurrence of each name wins, sorted by name within a
/// directory so that the order is stable.
pub fn find_plugins(dirs: &[PathBuf]) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name();
                let name = plugin_name(file.to_str()?)?.to_string();
                Some((name, e.path()))
            })
            .collect();
        here.sort();
        for (name, path) in here {
            if !found.iter().any(|(n, _)| *n == name) {
                found.push((name, path));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_come_from_file_names() {
        assert_eq!(plugin_name("liboffload_plugin_host.so"), Some("host"));
        assert_eq!(plugin_name("liboffload_plugin_.so"), None);
        assert_eq!(plugin_name("libfoo.so"), None);
        assert_eq!(plugin_name("liboffload_plugin_cuda.so.1"), None);
    }

    #[test]
    fn first_directory_wins_and_spaces_are_fine() {
        let base = std::env::temp_dir().join(format!("offload disc {}", std::process::id()));
        let (a, b) = (base.join("dir a"), base.join("dir b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        for d in [&a, &b] {
            std::fs::write(d.join("liboffload_plugin_x.so"), b"").unwrap();
        }
        std::fs::write(b.join("liboffload_plugin_y.so"), b"").unwrap();
        std::fs::write(b.join("unrelated.so"), b"").unwrap();
        let found = find_plugins(&[a.clone(), b.clone(), base.join("missing")]);
        assert_eq!(found.len(), 2);
        assert_eq!(
            found[0],
            ("x".to_string(), a.join("liboffload_plugin_x.so"))
        );
        assert_eq!(
            found[1],
            ("y".to_string(), b.join("liboffload_plugin_y.so"))
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
