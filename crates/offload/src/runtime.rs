//! The runtime proper: plugin slots, lazy initialisation, routing, and RAII wrappers for
//! programs and device buffers.

use crate::discovery;
use offload_abi::AbiJitService;
use offload_abi::loader::{LoadedPlugin, jit_service_table};
use offload_core::image::{ElfEndian, machine};
use offload_core::{
    DeviceInfo, Error, GenericDevice, GenericPlugin, ImageKind, KernelArg, KernelHandle,
    LaunchDims, MemoryKind, ProgramHandle, QueueHandle, Result, classify,
};
use offload_jit_client::{JitClient, JitConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::params::{KernelParams, MAX_PARAMS_TEXT, PARAMS_PREFIX};
use offload_core::sync::lock;

/// The process's JIT client: one per process, shared by every runtime and every plugin, so a
/// process has at most one JIT worker and one cache. Made on first use; it starts nothing until
/// the first compile.
pub fn jit_client() -> &'static Arc<JitClient> {
    JIT_CLIENT.get_or_init(|| Arc::new(JitClient::from_env(Vec::new())))
}

static JIT_CLIENT: OnceLock<Arc<JitClient>> = OnceLock::new();

/// Makes the process's JIT client with `config`; an error if it exists already (a runtime or
/// a compile came first: the JIT is configured once per process).
fn configure_jit(config: JitConfig) -> Result<()> {
    let mut fresh = Some(config);
    JIT_CLIENT
        .get_or_init(|| Arc::new(JitClient::new(Ok(fresh.take().expect("once")), Vec::new())));
    if fresh.is_some() {
        return Err(Error::InvalidArgument(
            "JIT options were given to a runtime builder, but this process's JIT is already \
             configured (a runtime was made, or something compiled, before): JIT options apply \
             to the first runtime of a process"
                .into(),
        ));
    }
    Ok(())
}

/// The ABI form of the process's JIT service for the plugin named `name` (its compiles are
/// counted under that name). Made once per name: plugins keep the pointer forever.
fn jit_service_for(name: &str) -> &'static AbiJitService {
    static TABLES: OnceLock<Mutex<HashMap<String, &'static AbiJitService>>> = OnceLock::new();
    let mut tables = offload_core::sync::lock(TABLES.get_or_init(Mutex::default));
    tables
        .entry(name.to_string())
        .or_insert_with(|| jit_service_table(jit_client().service(name)))
}

/// What `offload info` reports for a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginStatus {
    /// Loaded and initialised with this many devices (at least one).
    Ok(usize),
    /// Loaded and initialised, but it has no device; the reason says why.
    NoDevices(String),
    /// Could not be loaded or initialised.
    Failed(String),
}

impl PluginStatus {
    /// `ok`, `no-devices` or `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            PluginStatus::Ok(_) => "ok",
            PluginStatus::NoDevices(_) => "no-devices",
            PluginStatus::Failed(_) => "failed",
        }
    }

    /// The failure or no-device reason, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            PluginStatus::Ok(_) => None,
            PluginStatus::NoDevices(r) | PluginStatus::Failed(r) => Some(r),
        }
    }
}

enum SlotState {
    Failed(Error),
    Loaded {
        plugin: Arc<dyn GenericPlugin>,
        /// The ABI version of a plugin library (`None`: linked into this program).
        abi: Option<(u16, u16)>,
        /// What built it (the library's build id, or the linked runtime's version).
        build_id: String,
        init: OnceLock<std::result::Result<usize, Error>>,
        /// The plugin took the process's JIT service (it compiles bitcode through it).
        uses_jit: bool,
        /// Each device object, made once: a device's identity is stable across lookups.
        devices: Mutex<Vec<Option<Arc<dyn GenericDevice>>>>,
    },
}

impl std::fmt::Debug for SlotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotState::Failed(e) => write!(f, "Failed({e})"),
            SlotState::Loaded { plugin, abi, .. } => {
                write!(f, "Loaded({}, abi {abi:?})", plugin.name())
            }
        }
    }
}

/// One plugin library the runtime found.
#[derive(Debug)]
pub struct PluginSlot {
    /// The name its file gives it (`liboffload_plugin_<name>.so`), which its table must match.
    name: String,
    path: PathBuf,
    state: SlotState,
}

impl PluginSlot {
    fn open(name: String, path: PathBuf) -> PluginSlot {
        // SAFETY: the plugin directories are the program's configuration, trusted as the
        // dynamic loader's search path is: a `liboffload_plugin_<name>.so` there is a plugin
        // built for this ABI (docs/architecture.md, "What is trusted").
        let state = match unsafe { LoadedPlugin::open(&path) } {
            // A plugin whose constructor failed exports an empty name; its `init` says why.
            Ok(plugin) if plugin.name().is_empty() => SlotState::Failed(
                plugin
                    .init()
                    .err()
                    .unwrap_or_else(|| Error::PluginLoad("the plugin has an empty name".into()))
                    .context(format!("'{}'", path.display())),
            ),
            // A plugin is what its file says it is: one that calls itself something else could
            // take over another plugin's devices (`--device host:0`).
            Ok(plugin) if plugin.name() != name => SlotState::Failed(Error::PluginLoad(format!(
                "'{}' calls itself '{}', but its file name says '{name}': a plugin's name must \
                 match its file (liboffload_plugin_<name>.so)",
                path.display(),
                offload_core::text::printable(plugin.name())
            ))),
            Ok(plugin) => {
                // Offered before init; a plugin that compiles nothing says so.
                let uses_jit = plugin
                    .set_jit_service(jit_service_for(plugin.name()))
                    .is_ok();
                SlotState::Loaded {
                    abi: Some(plugin.abi_version()),
                    build_id: plugin.build_id().to_string(),
                    plugin,
                    init: OnceLock::new(),
                    uses_jit,
                    devices: Mutex::default(),
                }
            }
            Err(e) => SlotState::Failed(e),
        };
        PluginSlot { name, path, state }
    }

    /// The host backend linked into this program (the `host` feature), with the same checks
    /// in front of it as an exported plugin has.
    #[cfg(feature = "host")]
    fn linked_host() -> PluginSlot {
        // SAFETY: the host backend keeps the hooks' contract and the generic layer's is the
        // only use of its devices; the layer keeps the trait's contract.
        let plugin: Arc<dyn GenericPlugin> = Arc::new(unsafe {
            offload_plugin_common::Plugin::new(offload_host::HostBackend::new())
        });
        let uses_jit = plugin
            .set_jit_service(jit_client().service(plugin.name()))
            .is_ok();
        PluginSlot {
            name: plugin.name().to_string(),
            path: PathBuf::from(LINKED),
            state: SlotState::Loaded {
                plugin,
                abi: None,
                build_id: format!(
                    "linked into this program (offload {})",
                    env!("CARGO_PKG_VERSION")
                ),
                init: OnceLock::new(),
                uses_jit,
                devices: Mutex::default(),
            },
        }
    }

    /// The plugin ABI version of a plugin library (`None` when linked, or not loaded).
    pub fn abi_version(&self) -> Option<(u16, u16)> {
        match &self.state {
            SlotState::Loaded { abi, .. } => *abi,
            SlotState::Failed(_) => None,
        }
    }

    /// What built the plugin (`None` when it is not loaded).
    pub fn build_id(&self) -> Option<&str> {
        match &self.state {
            SlotState::Loaded { build_id, .. } => Some(build_id),
            SlotState::Failed(_) => None,
        }
    }

    /// Whether the plugin is linked into this program rather than loaded from a library.
    pub fn is_linked(&self) -> bool {
        matches!(self.state, SlotState::Loaded { abi: None, .. })
    }

    /// The plugin's name (its file's, which a loaded plugin's table matches).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library's path (`(linked into this program)` for a linked plugin).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ELF machine the plugin serves (`None` if it is not loaded).
    pub fn elf_machine(&self) -> Option<u16> {
        self.loaded().map(|p| p.elf_machine())
    }

    /// The plugin's target triple (`None` if it is not loaded).
    pub fn target_triple(&self) -> Option<String> {
        self.loaded().map(|p| p.target_triple().to_string())
    }

    /// The image kinds the plugin serves (`None` if it is not loaded).
    pub fn image_claims(&self) -> Option<Vec<offload_core::ImageClaim>> {
        self.loaded().map(|p| p.image_claims())
    }

    /// Facts about the plugin for reports (`None` if it is not loaded).
    pub fn properties(&self) -> Option<Vec<(String, String)>> {
        self.loaded().map(|p| p.properties())
    }

    pub(crate) fn loaded(&self) -> Option<&Arc<dyn GenericPlugin>> {
        match &self.state {
            SlotState::Loaded { plugin, .. } => Some(plugin),
            SlotState::Failed(_) => None,
        }
    }

    /// The plugin-level image check: whether the plugin serves images of this kind (ELF
    /// machine, bitcode triple), before any device is asked. Does not initialise the plugin.
    pub fn check_image(&self, image: &[u8]) -> Result<()> {
        self.loaded()
            .ok_or_else(|| Error::PluginLoad(format!("plugin '{}' is not loaded", self.name)))?
            .check_image(image)
    }

    /// Initialises the plugin on first call and returns its device count.
    pub fn device_count(&self) -> Result<usize> {
        match &self.state {
            SlotState::Failed(e) => Err(e.clone()),
            SlotState::Loaded { plugin, init, .. } => init.get_or_init(|| plugin.init()).clone(),
        }
    }

    /// Status for reports (initialises the plugin).
    pub fn status(&self) -> PluginStatus {
        match self.device_count() {
            Ok(0) => PluginStatus::NoDevices(format!("plugin '{}' reports 0 devices", self.name)),
            Ok(n) => PluginStatus::Ok(n),
            Err(e @ Error::NoDevice(_)) => PluginStatus::NoDevices(e.to_string()),
            Err(e) => PluginStatus::Failed(e.to_string()),
        }
    }

    /// Counters of the plugin's JIT requests (`None` if it compiles nothing or is not loaded).
    pub fn jit_stats(&self) -> Option<offload_core::JitStats> {
        match &self.state {
            SlotState::Loaded { uses_jit: true, .. } => {
                Some(jit_client().stats_for(&self.name).unwrap_or_default())
            }
            SlotState::Loaded { plugin, .. } => plugin.jit_stats(),
            SlotState::Failed(_) => None,
        }
    }

    /// Device `index` of this plugin.
    pub fn device(&self, index: usize) -> Result<Device> {
        let count = self
            .device_count()
            .map_err(|e| e.context(format!("plugin '{}'", self.name)))?;
        if index >= count {
            return Err(Error::NotFound(format!(
                "device {}:{index}: plugin '{}' has {count} device{}",
                self.name,
                self.name,
                if count == 1 { "" } else { "s" }
            )));
        }
        let SlotState::Loaded {
            plugin, devices, ..
        } = &self.state
        else {
            unreachable!("initialised plugins are loaded")
        };
        let inner = {
            let mut devices = lock(devices);
            if devices.len() < count {
                devices.resize_with(count, || None);
            }
            match &devices[index] {
                Some(d) => d.clone(),
                None => {
                    let d = plugin.device(index)?;
                    devices[index] = Some(d.clone());
                    d
                }
            }
        };
        Ok(Device {
            plugin: self.name.clone(),
            index,
            kind: offload_core::DeviceKind::of_elf_machine(plugin.elf_machine()),
            inner,
        })
    }
}

fn shown_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

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
    slots: Vec<PluginSlot>,
    notes: Vec<String>,
    /// The directories searched for plugins.
    searched: Vec<PathBuf>,
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

    /// The device a spec names: `plugin:index` (`cuda:1`) or `plugin` (its device 0). The
    /// error says what is wrong with the spec, or which plugins and devices there are.
    pub fn device_by_spec(&self, spec: &str) -> Result<Device> {
        let (name, index) = match spec.split_once(':') {
            None => (spec, 0),
            Some((name, index)) => match index.parse::<usize>() {
                Ok(i) => (name, i),
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

    /// Picks the plugin and device for an image. Native ELF goes by ELF machine, then the
    /// plugin's and each device's own compatibility check; LLVM bitcode and IR go to the first
    /// plugin that compiles the module's triple; PTX, CUDA fatbins and containers (offload
    /// binaries, offload bundles, and ELF files holding them) to the first plugin with a device
    /// that can run them (for a container: some entry of it). The first device that accepts
    /// the image wins.
    pub fn route(&self, image: &[u8]) -> Result<Device> {
        let _span =
            tracing::info_span!(target: "offload::image", "route", bytes = image.len()).entered();
        let routed = self.route_inner(image);
        match &routed {
            Ok(d) => {
                tracing::info!(target: "offload::image", "{}-byte image routed to {d}", image.len())
            }
            Err(e) => {
                tracing::info!(target: "offload::image", "{}-byte image not routed: {e}", image.len())
            }
        }
        routed
    }

    fn route_inner(&self, image: &[u8]) -> Result<Device> {
        if let Some(c) = offload_core::image::container::parse(image)? {
            tracing::info!(
                target: "offload::image",
                "a {} holding {} image(s): {}",
                c.format,
                c.entries.len(),
                c.entries.iter().map(|e| format!("{} ({} bytes)", e.label(), e.bytes.len())).collect::<Vec<_>>().join(", ")
            );
            let what = format!(
                "runs this {} ({} image{})",
                c.format,
                c.entries.len(),
                if c.entries.len() == 1 { "" } else { "s" }
            );
            return self.route_by_asking(image, &what);
        }
        let kind = classify(image)?;
        tracing::info!(target: "offload::image", "classified as {}", kind.describe());
        let info = match kind {
            ImageKind::Elf(info) => info,
            ImageKind::Bitcode { .. } | ImageKind::LlvmIr => return self.route_jit_input(image),
            other => {
                return self.route_by_asking(image, &format!("runs this {}", other.describe()));
            }
        };
        let serving: Vec<&PluginSlot> = self
            .slots
            .iter()
            .filter(|s| s.loaded().is_some_and(|p| p.elf_machine() == info.machine))
            .collect();
        if serving.is_empty() {
            let known: Vec<String> = self
                .slots
                .iter()
                .filter_map(|s| {
                    s.loaded().map(|p| {
                        format!("{} serves {}", s.name, machine::describe(p.elf_machine()))
                    })
                })
                .collect();
            let endian_hint = if info.endian != ElfEndian::host() {
                format!(
                    "; note: the image is {} (EI_DATA, offset 5); read the other way round its \
                     machine would be {}",
                    info.endian,
                    machine::describe(info.machine.swap_bytes())
                )
            } else {
                String::new()
            };
            return Err(Error::Unsupported(format!(
                "no loaded plugin serves ELF machine {} ({}){endian_hint}",
                machine::describe(info.machine),
                if known.is_empty() {
                    "no plugin loaded".to_string()
                } else {
                    known.join("; ")
                }
            )));
        }
        let mut first_error = None;
        for slot in serving {
            match slot.pick_device(image) {
                Ok(device) => return Ok(device),
                Err(e @ Error::NoDevice(_)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("plugin '{}'", slot.name)));
                }
            }
        }
        Err(first_error.expect("at least one plugin was tried"))
    }

    /// Asks every loaded plugin in turn; the error (`no loaded plugin {what} (...)`) lists
    /// each one's reason.
    fn route_by_asking(&self, image: &[u8], what: &str) -> Result<Device> {
        let mut reasons = Vec::new();
        let mut no_device = None;
        for slot in self.slots.iter().filter(|s| s.loaded().is_some()) {
            match slot.pick_device(image) {
                Ok(device) => return Ok(device),
                Err(e @ Error::NoDevice(_)) => {
                    tracing::info!(target: "offload::plugin", "plugin '{}' has no device for it: {e}", slot.name);
                    no_device.get_or_insert(e);
                }
                Err(e) => {
                    tracing::info!(target: "offload::plugin", "plugin '{}' refuses it: {}", slot.name, e.message());
                    reasons.push(format!("{}: {}", slot.name, e.message()))
                }
            }
        }
        // A plugin that can run the image but has no device is the answer users need, with
        // why the others cannot run it.
        if let Some(Error::NoDevice(why)) = no_device {
            return Err(Error::NoDevice(if reasons.is_empty() {
                why
            } else {
                format!(
                    "{why}; and no other loaded plugin {what} ({})",
                    reasons.join("; ")
                )
            }));
        }
        Err(Error::Unsupported(format!(
            "no loaded plugin {what} ({})",
            if reasons.is_empty() {
                "no plugin loaded".to_string()
            } else {
                reasons.join("; ")
            }
        )))
    }

    fn route_jit_input(&self, image: &[u8]) -> Result<Device> {
        // Read without LLVM: routing never maps libLLVM, and a malformed module fails here.
        let triple = offload_core::image::bitcode::module_triple(image)?;
        if triple.is_empty() && offload_core::image::is_empty_llvm_module(image) {
            return Err(Error::Unsupported(
                "the LLVM module is empty (only comments, no top-level entities) and has no \
                 target triple, so it is not clear which device it is for; choose the device \
                 (--device PLUGIN:INDEX), whose triple it is then compiled for"
                    .into(),
            ));
        }
        if triple.is_empty() {
            return Err(Error::Unsupported(
                "the LLVM module has no target triple, so it is not clear which device it is \
                 for; add a `target triple` line (clang writes one), or choose the device \
                 (--device PLUGIN:INDEX), whose triple it is then compiled for"
                    .into(),
            ));
        }
        self.route_by_asking(image, "compiles this LLVM bitcode/IR")
    }
}

impl PluginSlot {
    /// The first device of this plugin that accepts `image`, after the plugin-level check. A
    /// plugin that can run the image but has no device says so (`NoDevice`, with its reason).
    fn pick_device(&self, image: &[u8]) -> Result<Device> {
        self.check_image(image)?;
        let count = match self.device_count() {
            Ok(n) => n,
            Err(Error::NoDevice(why)) => {
                return Err(Error::NoDevice(format!(
                    "plugin '{}' can run this image but has no device: {why}",
                    self.name
                )));
            }
            Err(e) => return Err(e),
        };
        if count == 0 {
            return Err(Error::NoDevice(format!(
                "plugin '{}' can run this image but reports 0 devices",
                self.name
            )));
        }
        let mut last = None;
        for i in 0..count {
            let device = self.device(i)?;
            match device.inner.check_image(image) {
                Ok(()) => return Ok(device),
                Err(e) => last = Some(e.context(format!("device {}:{i}", self.name))),
            }
        }
        Err(last.expect("count > 0"))
    }
}

/// A device of a plugin, with its address (`plugin:index`) for messages.
#[derive(Clone)]
pub struct Device {
    plugin: String,
    index: usize,
    kind: offload_core::DeviceKind,
    inner: Arc<dyn GenericDevice>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}:{})", self.plugin, self.index)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.plugin, self.index)
    }
}

impl Device {
    /// Identifies the device object (for binding kernels to their program's device).
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// The plugin's name.
    pub fn plugin_name(&self) -> &str {
        &self.plugin
    }

    /// Index within the plugin.
    pub fn index(&self) -> usize {
        self.index
    }

    /// What kind of processor it is (from its plugin's ELF machine).
    pub fn kind(&self) -> offload_core::DeviceKind {
        self.kind
    }

    /// The device API, for this crate's own checked wrappers.
    pub(crate) fn inner(&self) -> &Arc<dyn GenericDevice> {
        &self.inner
    }

    /// Device information.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.inner.info()
    }

    /// Loads an image that this program trusts as its own code; it is unloaded when the
    /// [`Program`] is dropped. This is the safe API's one trust point for device code: after
    /// it, kernels launch through checked, safe calls ([`Kernel::launch`], [`TypedKernel`]).
    ///
    /// The layer checks what an image is (its format, ELF machine, target and symbols; a
    /// container's entries; bitcode's triple) and refuses one this device cannot run, naming
    /// why. It cannot check what the image's code does, so it believes two things about it:
    ///
    /// - **Its code.** Loading runs the image's initialisers (a host image's `.init_array`, a
    ///   GPU image's constructor kernels) in this process or on the device, and a kernel does
    ///   whatever its code says with the memory its arguments reach.
    /// - **What it says of its kernels.** A launch checks the arguments against the kernel's
    ///   parameter record (`OFFLOAD_PARAMS`: each buffer's element type and how many elements
    ///   the kernel reads or writes, as expressions of the scalar arguments) and, where the
    ///   image declares them, against its parameter types (bitcode signatures; a host ELF's
    ///   `OFFLOAD_SIGNATURE`; a SPIR-V module's entry point). The record is the image's word
    ///   about itself: a record that says `float y[n]` for a kernel that writes `2n` elements
    ///   is memory corruption, and no check here can see it. A kernel without a record is
    ///   checked for its argument count and types only where the image declares them, and
    ///   for no extent.
    ///
    /// # Safety
    /// `image` is code the caller would run as its own native code, as wgpu's
    /// `create_shader_module_trusted` asks of a shader: built by or for this program (its
    /// build script's `offload_build` output, [`include_kernels!`](crate::include_kernels), a
    /// file it ships), with each kernel's parameter record true to its code (a kernel touches
    /// no element of a buffer beyond what its record says, and writes only buffers its record
    /// calls writable). Bytes from elsewhere (a network, a user's upload) are not.
    ///
    /// [`TypedKernel`]: crate::TypedKernel
    pub unsafe fn load_trusted(&self, image: &[u8]) -> Result<Program> {
        let _span = tracing::info_span!(
            target: "offload::image",
            "image load",
            device = %self,
            bytes = image.len(),
            "load a {}-byte image on {self}", image.len()
        )
        .entered();
        // SAFETY: the caller trusts the image (this function's contract).
        let handle = unsafe { self.inner.load_image(image) }?;
        Ok(Program {
            inner: Arc::new(ProgramInner {
                device: self.clone(),
                handle,
                kernels: Mutex::default(),
            }),
        })
    }

    /// Allocates device memory, freed when the [`DeviceBuffer`] is dropped.
    pub fn alloc_buffer(&self, size: u64) -> Result<DeviceBuffer> {
        let len = usize::try_from(size).map_err(|_| {
            Error::OutOfMemory(format!("{size} bytes cannot be addressed on this host"))
        })?;
        self.alloc::<u8>(len)
    }

    /// A buffer of `len` elements of `T` (contents unspecified: any bits, which `T` allows).
    /// Zero elements are an error, as a zero-byte allocation is.
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let size = Self::byte_size::<T>(len)?;
        let ptr = self.inner.alloc(size, MemoryKind::Device)?;
        tracing::info!(target: "offload::memory", device = %self, "allocated {size} bytes at {ptr} on {self}");
        Ok(DeviceBuffer::from_raw(self.inner.clone(), ptr, len))
    }

    /// `len` elements of host memory the device reaches (pinned on CUDA), which the host
    /// reads and writes in place ([`crate::HostBuffer`]); zero-copy on the host backend.
    pub fn alloc_host<T: DeviceCopy>(&self, len: usize) -> Result<crate::HostBuffer<T>> {
        self.alloc_kind(len, MemoryKind::Host)
    }

    /// `len` elements of memory host and device share (managed memory on GPUs), read and
    /// written in place by the host ([`crate::HostBuffer`]).
    pub fn alloc_shared<T: DeviceCopy>(&self, len: usize) -> Result<crate::HostBuffer<T>> {
        self.alloc_kind(len, MemoryKind::Shared)
    }

    fn alloc_kind<T: DeviceCopy>(
        &self,
        len: usize,
        kind: MemoryKind,
    ) -> Result<crate::HostBuffer<T>> {
        let size = Self::byte_size::<T>(len)?;
        let ptr = self.inner.alloc(size, kind)?;
        tracing::info!(target: "offload::memory", device = %self, "allocated {size} bytes of {kind:?} memory at {ptr} on {self}");
        crate::HostBuffer::new(
            DeviceBuffer::from_raw(self.inner.clone(), ptr, len),
            kind,
            &self.to_string(),
        )
    }

    fn byte_size<T: DeviceCopy>(len: usize) -> Result<u64> {
        Ok(len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|s| *s > 0 || std::mem::size_of::<T>() == 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a buffer of {len} elements of {} ({} bytes each) cannot be allocated",
                    std::any::type_name::<T>(),
                    std::mem::size_of::<T>()
                ))
            })? as u64)
    }

    /// A queue of this device: work enqueued on it runs in order, asynchronously to the
    /// caller ([`crate::Queue`]).
    pub fn queue(&self) -> Result<crate::Queue> {
        crate::Queue::new(self.clone())
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc::<T>(data.len())?;
        buf.write(data)?;
        Ok(buf)
    }
}

/// A loaded image; it is unloaded when the `Program` and every [`Kernel`] of it are dropped.
#[derive(Debug)]
pub struct Program {
    inner: Arc<ProgramInner>,
}

impl Program {
    /// What the program shares with its kernels (for [`crate::raw`]).
    pub(crate) fn shared(&self) -> &ProgramInner {
        &self.inner
    }
}

#[derive(Debug)]
pub(crate) struct ProgramInner {
    device: Device,
    handle: ProgramHandle,
    /// What was found about each kernel looked up, by name.
    kernels: Mutex<HashMap<String, KernelMeta>>,
}

#[derive(Debug, Clone)]
struct KernelMeta {
    handle: KernelHandle,
    name: Arc<str>,
    params: Option<Arc<std::result::Result<KernelParams, String>>>,
    rules: Option<Arc<[crate::launch::Rule]>>,
}

impl Drop for ProgramInner {
    fn drop(&mut self) {
        // SAFETY: the program's last owner is gone: the kernels and global views of it that the
        // safe API hands out hold it (or borrow it); queued work keeps it in the layer.
        let _ = unsafe { self.device.inner.unload_image(self.handle) };
    }
}

impl Program {
    /// The device it is loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The plugin's handle.
    pub fn handle(&self) -> ProgramHandle {
        self.inner.handle
    }

    /// Looks up a kernel, and the parameter list `OFFLOAD_PARAMS` recorded for it (see
    /// [`Kernel::params`]). The [`Kernel`] keeps this program loaded; launching it through
    /// another program is an error.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let p = &self.inner;
        // Looked up once per name: the handle and the record are kept with the program.
        if let Some(meta) = lock(&p.kernels).get(name).cloned() {
            return Ok(Kernel {
                program: p.clone(),
                handle: meta.handle,
                name: meta.name,
                params: meta.params,
                rules: meta.rules,
            });
        }
        let handle = p.device.inner.kernel(p.handle, name)?;
        let params = self.read_params(name);
        let rules = match &params {
            Some(Ok(record)) => Some(crate::launch::rules(record).into()),
            _ => None,
        };
        let meta = KernelMeta {
            handle,
            name: name.into(),
            params: params.map(Arc::new),
            rules,
        };
        lock(&p.kernels).insert(name.to_string(), meta.clone());
        Ok(Kernel {
            program: p.clone(),
            handle,
            name: meta.name,
            params: meta.params,
            rules: meta.rules,
        })
    }

    /// The global variable `name` of the image, as a read-only view of `T`s: copies from it,
    /// and a kernel argument the kernel only reads; it lives as long as the program is
    /// borrowed. The safe API does not write globals (one may be read-only data of the image,
    /// such as the kernels' parameter records); kernels write their own globals by name. An
    /// error when the image has no such global, or its size is not a whole number of `T`s.
    pub fn global<T: DeviceCopy>(&self, name: &str) -> Result<crate::BufferView<'_, T>> {
        let p = &self.inner;
        let g = p.device.inner.global(p.handle, name)?;
        let each = std::mem::size_of::<T>() as u64;
        if each == 0 || g.size % each != 0 {
            return Err(Error::InvalidArgument(format!(
                "global '{name}' of program {:#x} on {} is {} bytes, not a whole number of {} \
                 ({each} bytes each)",
                p.handle.0,
                p.device,
                g.size,
                std::any::type_name::<T>()
            )));
        }
        Ok(
            crate::BufferView::from_raw(&p.device.inner, g.ptr, (g.size / each) as usize)
                .read_only(),
        )
    }

    /// The `OFFLOAD_PARAMS` record of `kernel`, if the image has one: `Err` when it is there
    /// but cannot be read or parsed (a checked launch reports it).
    fn read_params(&self, kernel: &str) -> Option<std::result::Result<KernelParams, String>> {
        let p = &self.inner;
        let symbol = format!("{PARAMS_PREFIX}{kernel}");
        let g = match p.device.inner.global(p.handle, &symbol) {
            Ok(g) => g,
            // No record: the kernel was built without one (or the backend has no globals).
            Err(Error::NotFound(_) | Error::Unsupported(_)) => return None,
            // Any other failure (a lost device, a driver error) is the launch's to report.
            Err(e) => return Some(Err(format!("{symbol}: {}", e.message()))),
        };
        Some((|| {
            if g.size == 0 || g.size > MAX_PARAMS_TEXT {
                return Err(format!(
                    "{symbol} is {} bytes; a parameter record is 1 to {MAX_PARAMS_TEXT}",
                    g.size
                ));
            }
            let mut bytes = vec![0u8; g.size as usize];
            // SAFETY: the global's range as the device reports it; the safe API never writes a
            // program's globals.
            unsafe { p.device.inner.read(&mut bytes, g.ptr) }
                .map_err(|e| format!("{symbol} could not be read: {e}"))?;
            let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
            let text = std::str::from_utf8(text)
                .map_err(|e| format!("{symbol} is not UTF-8 text: {e}"))?;
            KernelParams::parse(text).map_err(|e| format!("{symbol} \"{text}\": {e}"))
        })())
    }

    pub(crate) fn check_kernel(&self, kernel: &Kernel) -> Result<()> {
        if !Arc::ptr_eq(&kernel.program, &self.inner) {
            return Err(Error::InvalidArgument(format!(
                "{kernel:?} belongs to program {:#x}{}, not to program {:#x} on {}",
                kernel.program.handle.0,
                if kernel.program.device.identity() == self.inner.device.identity() {
                    String::new()
                } else {
                    format!(" of {}", kernel.program.device)
                },
                self.inner.handle.0,
                self.inner.device
            )));
        }
        Ok(())
    }
}

impl ProgramInner {
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn check_queue(&self, queue: &crate::Queue) -> Result<()> {
        if queue.device_identity() != self.device.identity() {
            return Err(Error::InvalidArgument(format!(
                "{queue:?} is a queue of another device than {} (this program's)",
                self.device
            )));
        }
        Ok(())
    }

    /// Launches through the device; with `OFFLOAD_INFO`/`OFFLOAD_PROFILE` on, inside the
    /// launch's span (kept out of line: off, a launch pays one level check for it).
    ///
    /// # Safety
    /// As [`offload_core::traits::GenericDevice::launch`].
    #[inline]
    pub(crate) unsafe fn launch(
        &self,
        kernel: &Kernel,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if tracing::enabled!(target: "offload::launch", tracing::Level::INFO) {
            // SAFETY: the caller's contract.
            return unsafe { self.launch_in_span(kernel, dims, args, queue) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.device.inner.launch(kernel.handle, dims, args, queue) }
    }

    /// # Safety
    /// As [`ProgramInner::launch`].
    #[cold]
    #[inline(never)]
    unsafe fn launch_in_span(
        &self,
        kernel: &Kernel,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let _span = tracing::info_span!(
            target: "offload::launch",
            "kernel launch",
            kernel = %kernel.name,
            device = %self.device,
            grid = ?dims.grid,
            block = ?dims.block,
            shared_mem = dims.shared_mem_bytes,
            args = ?args,
            "kernel '{}' on {}, grid {}x{}x{}, block {}x{}x{}, {} bytes of dynamic shared memory",
            kernel.name,
            self.device,
            dims.grid[0], dims.grid[1], dims.grid[2],
            dims.block[0], dims.block[1], dims.block[2],
            dims.shared_mem_bytes
        )
        .entered();
        // SAFETY: the caller's contract.
        unsafe { self.device.inner.launch(kernel.handle, dims, args, queue) }
    }
}

/// A kernel of a [`Program`]; it keeps the program loaded. [`Kernel::launch`] starts a launch
/// whose arguments are checked against the kernel's parameters.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) program: Arc<ProgramInner>,
    pub(crate) handle: KernelHandle,
    pub(crate) name: Arc<str>,
    pub(crate) params: Option<Arc<std::result::Result<KernelParams, String>>>,
    /// `params` compiled for the checked launch's fast path (`None` without a usable record).
    pub(crate) rules: Option<Arc<[crate::launch::Rule]>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Kernel('{}' {:#x} on {})",
            self.name, self.handle.0, self.program.device
        )
    }
}

impl Kernel {
    /// The plugin's handle (for the raw device API: queues, events).
    pub fn handle(&self) -> KernelHandle {
        self.handle
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter list `OFFLOAD_PARAMS(kernel, ...)` recorded in the image: `None` if the
    /// image has none, `Some(Err)` with the reason when it has one that is not readable.
    pub fn params(&self) -> Option<std::result::Result<&KernelParams, &str>> {
        self.params
            .as_deref()
            .map(|r| r.as_ref().map_err(String::as_str))
    }
}
