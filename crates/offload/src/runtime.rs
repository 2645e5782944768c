//! The runtime: its builder, the plugin slots it found, and device lookup by name, spec or
//! default.

use crate::discovery;
use crate::plugins::{SlotState, configure_jit, jit_client, shown_dirs};
use crate::{Device, PluginSlot};
use offload_core::{Error, Result};
use offload_jit_client::{JitClient, JitConfig};
use std::path::PathBuf;
use std::sync::Arc;

/// Settings of a [`Runtime`] in code ([`Runtime::builder`]). Unset, each comes from the
/// environment as for [`Runtime::from_env`].
#[derive(Debug, Default, Clone)]
#[must_use]
pub struct RuntimeBuilder {
    dirs: Vec<PathBuf>,
    only: Option<Vec<String>>,
    jit_worker: Option<PathBuf>,
    jit_opt_level: Option<u8>,
    jit_disk_cache: Option<offload_jit_client::DiskMode>,
    jit_cache_dir: Option<PathBuf>,
    no_linked_host: bool,
}

impl RuntimeBuilder {
    /// Whether the host backend linked into this program (the `host` feature, on by default)
    /// serves the host when no host plugin library is found (default: yes).
    pub fn linked_host(mut self, yes: bool) -> Self {
        self.no_linked_host = !yes;
        self
    }

    /// Searches `dir` for plugins (in the order given); with none given, the default
    /// directories and `OFFLOAD_PLUGIN_PATH` ([`discovery::default_plugin_dirs`]).
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dirs.push(dir.into());
        self
    }

    /// Loads only the plugins of these names (instead of `OFFLOAD_PLUGINS`).
    pub fn only<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.only = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// The JIT worker executable (instead of `OFFLOAD_JIT_WORKER` and the search beside the
    /// plugins and the executable).
    pub fn jit_worker(mut self, path: impl Into<PathBuf>) -> Self {
        self.jit_worker = Some(path.into());
        self
    }

    /// The JIT's optimisation level, 0 to 3 (instead of `OFFLOAD_JIT_OPT_LEVEL`).
    pub fn jit_opt_level(mut self, level: u8) -> Self {
        self.jit_opt_level = Some(level);
        self
    }

    /// What the JIT's disk cache may do (instead of `OFFLOAD_CACHE`).
    pub fn jit_disk_cache(mut self, mode: offload_jit_client::DiskMode) -> Self {
        self.jit_disk_cache = Some(mode);
        self
    }

    /// The JIT disk cache's directory (instead of `OFFLOAD_CACHE_DIR`).
    pub fn jit_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.jit_cache_dir = Some(dir.into());
        self
    }

    /// The runtime. An error when a directory given does not exist, when no plugin is found
    /// (naming every directory searched), when a plugin `only` names is missing, for a bad
    /// JIT option, or for JIT options when the process's JIT is already configured.
    pub fn build(self) -> Result<Runtime> {
        crate::diagnostics::init(None)?;
        let jit_asked = self.jit_worker.is_some()
            || self.jit_opt_level.is_some()
            || self.jit_disk_cache.is_some()
            || self.jit_cache_dir.is_some();
        // What can be checked before the process's JIT is configured (once) is checked first.
        if let Some(d) = self.dirs.iter().find(|d| !d.is_dir()) {
            return Err(Error::NotFound(format!(
                "plugin directory '{}' does not exist or is not a directory",
                d.display()
            )));
        }
        if jit_asked {
            let mut config = JitConfig::from_env()?;
            if let Some(level) = self.jit_opt_level {
                if level > 3 {
                    return Err(Error::InvalidArgument(format!(
                        "JIT optimisation level {level}: expected 0 to 3"
                    )));
                }
                config.options.opt_level = level;
            }
            if let Some(w) = &self.jit_worker {
                if !w.is_file() {
                    return Err(Error::InvalidArgument(format!(
                        "JIT worker '{}' is not a file",
                        w.display()
                    )));
                }
                config.worker = Some(w.clone());
            }
            if let Some(mode) = self.jit_disk_cache {
                config.disk.mode = mode;
            }
            if let Some(dir) = &self.jit_cache_dir {
                config.disk.dir = std::path::absolute(dir).map_err(|e| {
                    Error::InvalidArgument(format!("JIT cache directory '{}': {e}", dir.display()))
                })?;
                config.disk.note = None;
            }
            configure_jit(config)?;
        }
        let dirs = if self.dirs.is_empty() {
            discovery::default_plugin_dirs()?
        } else {
            self.dirs.clone()
        };
        let (only, what) = match &self.only {
            Some(o) => (Some(o.clone()), "the runtime builder's only()".to_string()),
            None => {
                let f = discovery::plugin_filter()?;
                let what = f.as_ref().map_or(String::new(), |o| {
                    format!(
                        "environment variable {}='{}'",
                        discovery::ENV_PLUGINS,
                        o.join(",")
                    )
                });
                (f, what)
            }
        };
        let mut rt = Runtime::with_plugin_dirs(&dirs, only.as_deref());
        if !self.no_linked_host {
            rt.add_linked_host(only.as_deref());
        }
        if rt.slots.is_empty() {
            return Err(Error::NotFound(format!(
                "no offload plugin found: searched {} for {}*{}; put the plugins (and \
                 offload-jit-worker) there, or name their directory with plugin_dir() or {}",
                shown_dirs(&dirs),
                discovery::PLUGIN_PREFIX,
                discovery::PLUGIN_SUFFIX,
                discovery::ENV_PLUGIN_PATH
            )));
        }
        if let Some(only) = &only {
            rt.check_only(only, &dirs, &what)?;
        }
        Ok(rt)
    }
}

/// The path a linked plugin reports ([`PluginSlot::path`]).
pub const LINKED: &str = "(linked into this program)";

/// `OFFLOAD_DEFAULT_DEVICE`: the device [`Runtime::default_device`] picks (`plugin:index`).
pub const ENV_DEFAULT_DEVICE: &str = "OFFLOAD_DEFAULT_DEVICE";

/// The offload runtime: the plugins found at start-up.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) slots: Vec<PluginSlot>,
    pub(crate) notes: Vec<String>,
    /// The directories searched for plugins.
    pub(crate) searched: Vec<PathBuf>,
}

impl Runtime {
    /// Discovers plugins in [`discovery::default_plugin_dirs`], honouring `OFFLOAD_PLUGINS`;
    /// with the `host` feature, the linked host backend serves the host when no host plugin
    /// library is found.
    /// A bad `OFFLOAD_PLUGIN_PATH` or `OFFLOAD_PLUGINS` (not Unicode, a relative directory, a
    /// plugin name that no file has) is an error naming the variable. A plugin that cannot be
    /// loaded is kept as a failed slot with its reason.
    pub fn from_env() -> Result<Runtime> {
        crate::diagnostics::init(None)?;
        let dirs = discovery::default_plugin_dirs()?;
        let filter = discovery::plugin_filter()?;
        let mut rt = Runtime::with_plugin_dirs(&dirs, filter.as_deref());
        rt.add_linked_host(filter.as_deref());
        if let Some(only) = &filter {
            rt.check_only(
                only,
                &dirs,
                &format!(
                    "environment variable {}='{}'",
                    discovery::ENV_PLUGINS,
                    only.join(",")
                ),
            )?;
        }
        Ok(rt)
    }

    /// A runtime with its settings in code: plugin directories, which plugins, the JIT's
    /// options. Unlike [`Runtime::from_env`], [`RuntimeBuilder::build`] fails when it finds no
    /// plugin, naming every directory it searched.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// With the `host` feature: the linked host backend, when no host plugin library was found
    /// and `only` allows it. (A library found wins: the linked copy then stays unused.)
    fn add_linked_host(&mut self, only: Option<&[String]>) {
        #[cfg(feature = "host")]
        if !self.slots.iter().any(|s| s.name == "host")
            && only.is_none_or(|o| o.iter().any(|n| n == "host"))
        {
            let slot = PluginSlot::linked_host();
            tracing::info!(target: "offload::plugin", "plugin 'host' linked into this program");
            self.slots.push(slot);
        }
        #[cfg(not(feature = "host"))]
        let _ = only;
    }

    /// An error for each name of `only` that no plugin found in `dirs` has (`what`: where the
    /// names came from).
    fn check_only(&self, only: &[String], dirs: &[PathBuf], what: &str) -> Result<()> {
        for wanted in only {
            if !self.slots.iter().any(|s| s.name == *wanted) {
                return Err(Error::InvalidArgument(format!(
                    "{what} names plugin '{wanted}', but no {}{wanted}{} is in the plugin \
                     directories ({})",
                    discovery::PLUGIN_PREFIX,
                    discovery::PLUGIN_SUFFIX,
                    shown_dirs(dirs)
                )));
            }
        }
        Ok(())
    }

    /// Discovers plugins in `dirs`; with `only`, loads just the plugins of those names.
    pub fn with_plugin_dirs(dirs: &[PathBuf], only: Option<&[String]>) -> Runtime {
        let mut notes = Vec::new();
        if let Err(e) = crate::diagnostics::init(None) {
            notes.push(format!("diagnostics are off: {e}"));
        }
        // The JIT worker is looked for next to the plugins.
        jit_client().add_search_dirs(dirs);
        let (found, shadowed) = discovery::find_plugins(dirs);
        notes.extend(shadowed);
        if let Some(only) = only {
            for wanted in only {
                if !found.iter().any(|f| f.name == *wanted) {
                    notes.push(format!(
                        "{} names plugin '{wanted}', but no {}{}{} was found",
                        discovery::ENV_PLUGINS,
                        discovery::PLUGIN_PREFIX,
                        wanted.replace('-', "_"),
                        discovery::PLUGIN_SUFFIX
                    ));
                }
            }
        }
        let slots = found
            .into_iter()
            .filter(|f| only.is_none_or(|o| o.contains(&f.name)))
            .map(|f| match f.refused {
                Some(why) => PluginSlot {
                    name: f.name,
                    path: f.path,
                    state: SlotState::Failed(Error::PluginLoad(why)),
                },
                None => PluginSlot::open(f.name, f.path),
            })
            .collect::<Vec<_>>();
        for slot in &slots {
            match &slot.state {
                SlotState::Loaded { abi, uses_jit, .. } => tracing::info!(
                    target: "offload::plugin",
                    path = %slot.path.display(),
                    abi = %abi.map_or("linked".to_string(), |(a, b)| format!("{a}.{b}")),
                    "plugin '{}' loaded{}",
                    slot.name,
                    if *uses_jit { " (uses the JIT)" } else { "" }
                ),
                SlotState::Failed(e) => tracing::info!(
                    target: "offload::plugin",
                    path = %slot.path.display(),
                    "plugin '{}' not loaded: {e}",
                    slot.name
                ),
            }
        }
        Runtime {
            slots,
            notes,
            searched: dirs.to_vec(),
        }
    }

    /// Every plugin found, loaded or not.
    pub fn plugins(&self) -> &[PluginSlot] {
        &self.slots
    }

    /// Problems met during discovery that are not tied to one plugin.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The process's JIT client (shared by every plugin and every runtime).
    pub fn jit(&self) -> &'static Arc<JitClient> {
        jit_client()
    }

    /// The plugin named `name`.
    pub fn plugin(&self, name: &str) -> Result<&PluginSlot> {
        self.slots.iter().find(|s| s.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.slots.iter().map(|s| s.name.as_str()).collect();
            Error::NotFound(format!(
                "plugin '{name}' (found: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ))
        })
    }

    /// Device `index` of plugin `name`.
    pub fn device(&self, name: &str, index: usize) -> Result<Device> {
        self.plugin(name)?.device(index)
    }

    /// Every device of every loaded plugin, in the plugins' order (as `offload info` lists
    /// them), each plugin's in index order. Plugins that failed to load or to initialise give
    /// none ([`Runtime::plugins`] says why).
    pub fn devices(&self) -> Vec<Device> {
        self.slots
            .iter()
            .flat_map(|s| {
                let n = s.device_count().unwrap_or(0);
                (0..n).filter_map(move |i| s.device(i).ok())
            })
            .collect()
    }

    /// The device a spec names: `plugin:index` (`cuda:1`), `plugin` (its device 0), or the
    /// address a device's name starts with (a remote device's `mpi:1/host:0`). The error says
    /// what is wrong with the spec, or which plugins and devices there are.
    pub fn device_by_spec(&self, spec: &str) -> Result<Device> {
        let (name, index) = match spec.split_once(':') {
            None => (spec, 0),
            Some((name, index)) => match index.parse::<usize>() {
                Ok(i) => (name, i),
                // A device that names itself by an address of its plugin's: a remote device
                // `mpi:<rank>/<plugin>:<n>`, whose name starts with it.
                Err(_) if self.plugin(name).is_ok_and(|s| s.device_count().is_ok()) => {
                    let slot = self.plugin(name)?;
                    let count = slot.device_count()?;
                    let prefix = format!("{spec} ");
                    for i in 0..count {
                        let d = slot.device(i)?;
                        if d.info().is_ok_and(|info| info.name.starts_with(&prefix)) {
                            return Ok(d);
                        }
                    }
                    return Err(Error::NotFound(format!(
                        "device '{spec}': '{index}' is not a device index, and no device of \
                         plugin '{name}' is at that address (expected plugin:index, e.g. cuda:1, \
                         or a remote device's address, e.g. mpi:1/host:0)"
                    )));
                }
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "device '{spec}': '{index}' is not a device index (expected plugin or \
                         plugin:index, e.g. cuda:1)"
                    )));
                }
            },
        };
        if name.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "device '{spec}': no plugin name (expected plugin or plugin:index, e.g. cuda:1)"
            )));
        }
        self.device(name, index)
            .map_err(|e| e.context(format!("device '{spec}'")))
    }

    /// The device to use when the program does not say: the one `OFFLOAD_DEFAULT_DEVICE` names
    /// (a spec for [`Runtime::device_by_spec`]), else the first GPU, else the first CPU device,
    /// else the first device. An error when there is none, saying what was found.
    pub fn default_device(&self) -> Result<Device> {
        if let Some((var, spec)) = offload_core::env::raw(&[ENV_DEFAULT_DEVICE])? {
            return self
                .device_by_spec(spec.trim())
                .map_err(|e| e.context(format!("environment variable {var}")));
        }
        let devices = self.devices();
        for kind in [offload_core::DeviceKind::Gpu, offload_core::DeviceKind::Cpu] {
            if let Some(d) = devices.iter().find(|d| d.kind() == kind) {
                return Ok(d.clone());
            }
        }
        devices.into_iter().next().ok_or_else(|| {
            let found: Vec<String> = self
                .slots
                .iter()
                .map(|s| match s.status().reason() {
                    Some(why) => format!("{} ({why})", s.name),
                    None => format!("{} (no devices)", s.name),
                })
                .collect();
            Error::NotFound(format!(
                "no device: {}",
                if found.is_empty() {
                    format!(
                        "no plugin was found (searched {})",
                        shown_dirs(&self.searched)
                    )
                } else {
                    format!("plugins found: {}", found.join("; "))
                }
            ))
        })
    }
}
