//! A loaded program and its kernels, with the parameter records read from the image.

use crate::params::{KernelParams, MAX_PARAMS_TEXT, PARAMS_PREFIX};
use crate::{Device, DeviceCopy};
use offload_core::sync::lock;
use offload_core::{
    Error, KernelArg, KernelHandle, LaunchDims, ProgramHandle, QueueHandle, Result,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A loaded image; it is unloaded when the `Program` and every [`Kernel`] of it are dropped.
#[derive(Debug)]
pub struct Program {
    inner: Arc<ProgramInner>,
}

impl Program {
    /// The program `handle` that `device` has just loaded; unloaded when the last of it (and
    /// of its kernels) goes.
    pub(crate) fn loaded(device: Device, handle: ProgramHandle) -> Program {
        Program {
            inner: Arc::new(ProgramInner {
                device,
                handle,
                kernels: Mutex::default(),
            }),
        }
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
    /// [`Kernel::params`]). The [`Kernel`] keeps this program loaded, and launches as its
    /// kernel ([`Kernel::launch`]).
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
