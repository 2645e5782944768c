//! Where plugin libraries are looked for, and which are loaded.

use offload_core::{Error, Result};
use std::path::{Path, PathBuf};

/// Directories (separated by `:`) searched for plugins before the default ones.
pub const ENV_PLUGIN_PATH: &str = "OFFLOAD_PLUGIN_PATH";
/// Comma-separated plugin names; when set, only these plugins are loaded.
pub const ENV_PLUGINS: &str = "OFFLOAD_PLUGINS";
/// Plugin library file names are `liboffload_plugin_<name>.so`.
pub const PLUGIN_PREFIX: &str = "liboffload_plugin_";
/// See [`PLUGIN_PREFIX`].
pub const PLUGIN_SUFFIX: &str = ".so";

/// Variable that makes the runtime load plugins from directories or files that others may
/// write to (see [`check_trust`]).
pub const ENV_TRUST: &str = "OFFLOAD_TRUST_PLUGIN_DIRS";

/// `OFFLOAD_PLUGIN_PATH` entries (absolute directories), then the executable's directory, then
/// `../lib` next to it. A relative entry, or a value that is not Unicode, is an error naming
/// the variable.
pub fn default_plugin_dirs() -> Result<Vec<PathBuf>> {
    let exe_dir = offload_core::fs::exe_dir();
    let mut dirs = plugin_path_entries()?;
    dirs.extend(dirs_beside(exe_dir.as_deref()));
    Ok(dirs)
}

/// The directories of `OFFLOAD_PLUGIN_PATH`, in order. A relative entry, or a value that is not
/// Unicode, is an error naming the variable.
pub fn plugin_path_entries() -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some((name, value)) = offload_core::env::raw(&[ENV_PLUGIN_PATH])? {
        for entry in value.split(':').filter(|s| !s.is_empty()) {
            let path = PathBuf::from(entry);
            if !path.is_absolute() {
                return Err(Error::InvalidArgument(format!(
                    "environment variable {name}='{value}': entry '{entry}' is a relative path; \
                     plugin directories must be absolute (a relative one would depend on the \
                     working directory)"
                )));
            }
            dirs.push(path);
        }
    }
    Ok(dirs)
}

/// Where plugins installed beside `anchor` (an executable's or a library's directory) are:
/// `anchor` itself, then `anchor/../lib`.
pub fn dirs_beside(anchor: Option<&Path>) -> Vec<PathBuf> {
    anchor
        .map(|d| vec![d.to_path_buf(), d.join("../lib")])
        .unwrap_or_default()
}

/// The `OFFLOAD_PLUGINS` filter, if set (a value that is not Unicode is an error naming it).
pub fn plugin_filter() -> Result<Option<Vec<String>>> {
    Ok(offload_core::env::raw(&[ENV_PLUGINS])?.map(|(_, v)| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }))
}

/// The short name of a plugin file (`liboffload_plugin_host.so` → `host`), with `_` read as
/// `-` (`liboffload_plugin_level_zero.so` → `level-zero`): cargo names a library's file with
/// underscores, plugins call themselves with hyphens.
pub fn plugin_name(file_name: &str) -> Option<String> {
    file_name
        .strip_prefix(PLUGIN_PREFIX)?
        .strip_suffix(PLUGIN_SUFFIX)
        .filter(|n| !n.is_empty())
        .map(|n| n.replace('_', "-"))
}

/// Whether plugins may be loaded from `path` (a plugin directory or file): it must not be
/// writable by others than its owner, and its owner must be root or this user; anyone else
/// could otherwise put code into this process. `OFFLOAD_TRUST_PLUGIN_DIRS=1` allows it.
pub fn check_trust(path: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::PluginLoad(format!("{what} '{}': {e}", path.display())))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let writable_by_others = meta.mode() & 0o022 != 0;
    let foreign_owner = meta.uid() != 0 && meta.uid() != me;
    if !writable_by_others && !foreign_owner {
        return Ok(());
    }
    if matches!(offload_core::env::raw(&[ENV_TRUST])?, Some((_, v)) if v == "1") {
        return Ok(());
    }
    let why = if writable_by_others {
        format!(
            "is writable by users other than its owner (mode {:o})",
            meta.mode() & 0o7777
        )
    } else {
        format!("belongs to another user (uid {}, you are {me})", meta.uid())
    };
    Err(Error::PluginLoad(format!(
        "{what} '{}' {why}: anyone who can write there could run code in this process; \
         make it yours and not writable by others (chmod go-w), or set {ENV_TRUST}=1 to load \
         from it anyway",
        path.display()
    )))
}

/// A plugin file found, or why one named like a plugin is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The plugin's name (from the file name).
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// Why it may not be loaded (an untrusted directory or file, not a regular file).
    pub refused: Option<String>,
}

/// Plugin files in `dirs`: the first occurrence of each name wins (later ones are reported in
/// `shadowed`), sorted by name within a directory so that the order is stable. Only regular
/// files are considered, and nothing is opened here.
pub fn find_plugins(dirs: &[PathBuf]) -> (Vec<Found>, Vec<String>) {
    let mut found: Vec<Found> = Vec::new();
    let mut shadowed = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<(String, PathBuf, std::fs::FileType)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name();
                let name = plugin_name(file.to_str()?)?;
                // Follows a symbolic link to what it names, without opening anything.
                let ft = std::fs::metadata(e.path()).map(|m| m.file_type()).ok()?;
                Some((name, e.path(), ft))
            })
            .collect();
        here.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        if here.is_empty() {
            continue;
        }
        let dir_trust = check_trust(dir, "plugin directory").err();
        for (name, path, ft) in here {
            if let Some(first) = found.iter().find(|f| f.name == name) {
                shadowed.push(format!(
                    "plugin '{name}': '{}' is not used, '{}' (found first) is",
                    path.display(),
                    first.path.display()
                ));
                continue;
            }
            let refused = if !ft.is_file() {
                Some(format!(
                    "'{}' is {}, not a regular file",
                    path.display(),
                    offload_core::fs::kind_of(ft)
                ))
            } else {
                dir_trust
                    .as_ref()
                    .map(|e| e.message().to_string())
                    .or_else(|| {
                        check_trust(&path, "plugin file")
                            .err()
                            .map(|e| e.message().to_string())
                    })
            };
            found.push(Found {
                name,
                path,
                refused,
            });
        }
    }
    (found, shadowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_come_from_file_names() {
        assert_eq!(
            plugin_name("liboffload_plugin_host.so").as_deref(),
            Some("host")
        );
        assert_eq!(
            plugin_name("liboffload_plugin_level_zero.so").as_deref(),
            Some("level-zero")
        );
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
        std::fs::create_dir(b.join("liboffload_plugin_z.so")).unwrap();
        let (found, shadowed) = find_plugins(&[a.clone(), b.clone(), base.join("missing")]);
        assert_eq!(found.len(), 3);
        assert_eq!(
            (found[0].name.as_str(), &found[0].path),
            ("x", &a.join("liboffload_plugin_x.so"))
        );
        assert_eq!(found[0].refused, None);
        assert_eq!(
            (found[1].name.as_str(), &found[1].path),
            ("y", &b.join("liboffload_plugin_y.so"))
        );
        assert!(
            found[2]
                .refused
                .as_deref()
                .unwrap()
                .contains("is a directory")
        );
        assert_eq!(shadowed.len(), 1);
        assert!(
            shadowed[0].contains("dir b/liboffload_plugin_x.so' is not used"),
            "{shadowed:?}"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
