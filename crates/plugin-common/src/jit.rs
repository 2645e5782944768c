//! The JIT as a plugin uses it: the runtime's process-wide service when it offers one (ABI
//! 1.2), else a client of the plugin's own that looks for the worker next to the plugin
//! library. Either way the plugin links no LLVM.

use offload_core::jit::{CompileRequest, JitOutput, JitService};
use offload_core::{JitStats, Result};
use offload_jit_client::JitClient;
use std::sync::{Arc, OnceLock};

/// See the module docs.
#[derive(Default)]
pub struct Jit {
    service: OnceLock<Arc<dyn JitService>>,
    own: OnceLock<Arc<JitClient>>,
    requester: &'static str,
}

impl std::fmt::Debug for Jit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jit")
            .field("runtime_service", &self.service.get().is_some())
            .field("own_client", &self.own.get().is_some())
            .finish()
    }
}

impl Jit {
    /// A JIT for the plugin named `requester`; nothing is started.
    pub fn new(requester: &'static str) -> Self {
        Jit {
            requester,
            ..Jit::default()
        }
    }

    /// Keeps the runtime's service (the first one offered wins: every runtime of a process
    /// offers the same one).
    pub fn offer(&self, service: Arc<dyn JitService>) {
        let _ = self.service.set(service);
    }

    fn service(&self) -> &Arc<dyn JitService> {
        self.service.get_or_init(|| {
            let client = self.own.get_or_init(|| {
                Arc::new(JitClient::from_env(
                    offload_core::fs::this_library_dir().into_iter().collect(),
                ))
            });
            client.service(self.requester)
        })
    }

    /// Compiles (or finds) `request`.
    pub fn compile(&self, request: &CompileRequest<'_>) -> Result<JitOutput> {
        self.service().compile(request)
    }

    /// Counters of the plugin's own client (`None` when it uses the runtime's, which counts
    /// them itself).
    pub fn stats(&self) -> Option<JitStats> {
        self.own.get().and_then(|c| c.stats_for(self.requester))
    }
}
