//! Plugin slots: a plugin library (or the linked host backend) as the runtime holds it, its
//! lazy initialisation and status, its devices made once; and the process's one JIT client.

use crate::{Device, LINKED};
use offload_abi::AbiJitService;
use offload_abi::loader::{LoadedPlugin, jit_service_table};
use offload_core::sync::lock;
use offload_core::{Error, GenericDevice, GenericPlugin, Result};
use offload_jit_client::{JitClient, JitConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The process's JIT client: one per process, shared by every runtime and every plugin, so a
/// process has at most one JIT worker and one cache. Made on first use; it starts nothing until
/// the first compile.
pub fn jit_client() -> &'static Arc<JitClient> {
    JIT_CLIENT.get_or_init(|| Arc::new(JitClient::from_env(Vec::new())))
}

static JIT_CLIENT: OnceLock<Arc<JitClient>> = OnceLock::new();

/// Makes the process's JIT client with `config`; an error if it exists already (a runtime or
/// a compile came first: the JIT is configured once per process).
pub(crate) fn configure_jit(config: JitConfig) -> Result<()> {
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
pub(crate) fn jit_service_for(name: &str) -> &'static AbiJitService {
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

pub(crate) enum SlotState {
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
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) state: SlotState,
}

impl PluginSlot {
    pub(crate) fn open(name: String, path: PathBuf) -> PluginSlot {
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
    pub(crate) fn linked_host() -> PluginSlot {
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

pub(crate) fn shown_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
