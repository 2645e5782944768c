//! Loading a host ELF shared object from memory.
//!
//! The bytes go into an anonymous `memfd` (sealed against writes) that is opened with
//! `dlopen("/proc/self/fd/N")`, so no file is written anywhere. The descriptor stays open while
//! the program is loaded, which keeps the path unique among live programs: the dynamic loader
//! matches already-loaded libraries by path, and a reused path would hand back the previous
//! image (the address-reuse bug of upstream's JIT cache, one layer down). If the loader keeps
//! an image resident after `dlclose` (e.g. it has `STB_GNU_UNIQUE` symbols), the descriptor is
//! kept open for the rest of the process so that its number, and so its path, is never reused.

use offload_core::jit::ParamType;
use offload_core::{ElfImage, Error, Result};
use std::ffi::{CStr, CString, c_void};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Process-wide unique program ids (never reused): memfd names.
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// Name of the function-pointer variable the kernel header defines for host builds; the plugin
/// points it at [`crate::launch::current_context`] when it loads the image.
pub const CONTEXT_SYMBOL: &CStr = c"__offload_host_context";

/// Name of the barrier function-pointer variable the kernel header defines for host builds.
pub const BARRIER_SYMBOL: &CStr = c"__offload_host_barrier";

/// Prefix of the work-group functions the JIT makes (`__offload_wg_<kernel>`).
pub const WORK_GROUP_PREFIX: &str = "__offload_wg_";
/// Prefix of their per-work-item frame sizes (`__offload_wgf_<kernel>`, a 64-bit constant).
pub const WORK_GROUP_FRAME_PREFIX: &str = "__offload_wgf_";
/// The JIT's version of the work-group calling convention (`__offload_wg_abi`, a 32-bit
/// constant). Images with another version (or none) run their kernels one work item at a time.
pub const WORK_GROUP_ABI: (&str, u32) = ("__offload_wg_abi", 2);

/// Prefix of the symbols `OFFLOAD_SIGNATURE` defines.
pub const SIGNATURE_PREFIX: &str = "__offload_signature_";
/// Most parameters a signature record may list.
const MAX_PARAMS: u64 = 255;

/// A shared object loaded by the dynamic loader from a memfd.
#[derive(Debug)]
pub struct Program {
    handle: *mut c_void,
    fd: Option<OwnedFd>,
    path: CString,
    pub image: ElfImage,
    /// Whether the image defines the work-item context (kernels that include the header do).
    pub has_context: bool,
}

// SAFETY: the dlopen handle may be used from any thread (the dynamic loader is thread-safe);
// the rest is plain owned data.
unsafe impl Send for Program {}
// SAFETY: see `Send`; `&Program` only allows `dlsym`, which is thread-safe.
unsafe impl Sync for Program {}

fn dl_error(what: &str) -> String {
    // SAFETY: dlerror returns null or a thread-local NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        format!("{what} failed")
    } else {
        // SAFETY: non-null, NUL-terminated.
        format!("{what}: {}", unsafe { CStr::from_ptr(e) }.to_string_lossy())
    }
}

impl Program {
    pub fn load(bytes: &[u8], image: ElfImage, has_context: bool) -> Result<Program> {
        let uid = NEXT_UID.fetch_add(1, Ordering::Relaxed);
        let name = CString::new(format!("offload-image-{uid}")).expect("no NUL in name");
        let fd = offload_core::fs::sealed_memfd(&name, bytes, "the image")?;
        // A trial load in another process first: what would crash or hang it is refused.
        // It first loads what this process lends the image (libomp, libstdc++).
        crate::probe::trial_load(fd.as_fd(), &crate::probe::providers(&image.imports))?;
        let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
        // SAFETY: `path` names our memfd; RTLD_LOCAL keeps the image's symbols out of the
        // global namespace. Running the image's initialisers is inherent to loading it.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(Error::InvalidImage(dl_error(
                "the dynamic loader rejected the image",
            )));
        }
        let program = Program {
            handle,
            fd: Some(fd),
            path,
            image,
            has_context,
        };
        if has_context {
            // The image's own definition (checked by `check_context`: a writable, pointer-sized
            // variable), and nothing else: the address must lie in this image.
            let slot = program
                .symbol(CONTEXT_SYMBOL.to_str().expect("ASCII"))
                .filter(|p| program.owns(*p))
                .ok_or_else(|| {
                    Error::InvalidImage(format!(
                        "the dynamic loader resolves {} to something outside the image",
                        CONTEXT_SYMBOL.to_string_lossy()
                    ))
                })?;
            // SAFETY: a writable, 8-byte, pointer-aligned variable of this image that holds
            // `const offload_host_context *(*)(void)`; nothing of the image runs concurrently.
            unsafe {
                (slot as *mut crate::launch::ContextGetter).write(crate::launch::current_context());
            }
        }
        // The barrier pointer, checked like the context (an image built with an older header
        // has none, and cannot call it).
        if let Some(slot) = program
            .symbol(BARRIER_SYMBOL.to_str().expect("ASCII"))
            .filter(|p| program.owns(*p))
        {
            // SAFETY: as above, for `void (*)(void)`.
            unsafe { (slot as *mut crate::launch::BarrierFn).write(crate::launch::barrier()) };
        }
        Ok(program)
    }

    /// Whether `addr` lies in this image (not a dependency or the program).
    fn owns(&self, addr: *mut c_void) -> bool {
        offload_core::fs::loaded_file_of(addr as usize).as_deref() == Some(self.path.as_c_str())
    }

    /// The parameter types `OFFLOAD_SIGNATURE(kernel, ...)` recorded for `kernel`, if the image
    /// has them (`__offload_signature_<kernel>`: version 1, a count, one code per parameter).
    pub fn signature(&self, kernel: &str) -> Result<Option<Vec<ParamType>>> {
        let name = format!("{SIGNATURE_PREFIX}{kernel}");
        let Some(sym) = self.image.symbol(&name) else {
            return Ok(None);
        };
        let bad = |what: String| Error::InvalidImage(format!("{name}: {what}"));
        if sym.is_function || !(2..=2 + MAX_PARAMS).contains(&sym.size) {
            return Err(bad(format!(
                "not a signature record (a {} of {} bytes)",
                if sym.is_function {
                    "function"
                } else {
                    "data object"
                },
                sym.size
            )));
        }
        let addr = self
            .symbol(&name)
            .filter(|a| self.owns(*a))
            .ok_or_else(|| bad("not found in the loaded image".into()))?;
        // SAFETY: a data object of the image, `sym.size` bytes long (the structural checks put
        // it inside a loaded segment), mapped while the program is loaded.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, sym.size as usize) };
        if bytes[0] != 1 || usize::from(bytes[1]) + 2 != bytes.len() {
            return Err(bad(format!(
                "version {} with {} codes in {} bytes; this plugin reads version 1",
                bytes[0],
                bytes[1],
                bytes.len()
            )));
        }
        bytes[2..]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                Ok(match c {
                    1 => ParamType::I32,
                    2 => ParamType::I64,
                    3 => ParamType::F32,
                    4 => ParamType::F64,
                    5 => ParamType::Ptr,
                    6 => ParamType::Other(
                        "a type offload cannot pass (char, short, long double, ...)".into(),
                    ),
                    other => {
                        return Err(bad(format!("parameter {i} has unknown type code {other}")));
                    }
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The work-group function the JIT made for `kernel`, if the image has one with this
    /// plugin's calling convention.
    pub fn work_group(&self, kernel: &str) -> Option<crate::launch::WorkGroup> {
        let (abi_name, abi) = WORK_GROUP_ABI;
        let version = self.constant(abi_name, 4)?;
        if version as u32 != abi {
            return None;
        }
        let name = format!("{WORK_GROUP_PREFIX}{kernel}");
        if !self.image.symbol(&name)?.is_function {
            return None;
        }
        let f = self.symbol(&name).filter(|p| self.owns(*p))?;
        let frame_bytes = self
            .constant(&format!("{WORK_GROUP_FRAME_PREFIX}{kernel}"), 8)
            .unwrap_or(0);
        Some(crate::launch::WorkGroup {
            // SAFETY: a function of this image with the work-group signature of version `abi`
            // (the JIT makes these names, and refuses to compile modules that define them).
            func: unsafe { std::mem::transmute::<*mut c_void, crate::launch::WorkGroupFn>(f) },
            frame_bytes,
        })
    }

    /// The value of a 4- or 8-byte data symbol of this image.
    fn constant(&self, name: &str, bytes: u64) -> Option<u64> {
        let sym = self.image.symbol(name)?;
        if sym.is_function || sym.size != bytes {
            return None;
        }
        let p = self.symbol(name).filter(|p| self.owns(*p))?;
        // SAFETY: a data symbol of this loaded image, `bytes` long (its ELF size), mapped.
        Some(unsafe {
            if bytes == 4 {
                u64::from(p.cast::<u32>().read_unaligned())
            } else {
                p.cast::<u64>().read_unaligned()
            }
        })
    }

    /// Address of a symbol defined by this image (not one of its dependencies).
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        self.image.symbol(name)?;
        let c = CString::new(name).ok()?;
        // SAFETY: valid handle and C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `handle` came from dlopen and is closed exactly once; nothing of this
        // program is used after its last `Arc` is gone.
        unsafe { libc::dlclose(self.handle) };
        // SAFETY: RTLD_NOLOAD only asks whether the path is still resident.
        let still = unsafe { libc::dlopen(self.path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if still.is_null() {
            drop(self.fd.take());
        } else {
            // SAFETY: balance the reference RTLD_NOLOAD took.
            unsafe { libc::dlclose(still) };
            // Keep the descriptor (and so the path) reserved forever: see the module docs.
            std::mem::forget(self.fd.take());
        }
    }
}

/// Whether the image defines the kernel header's context variable (and its barrier variable),
/// and that each is what the header makes: a writable, pointer-sized, aligned data object of
/// the image itself. Anything else under those names (a function, a constant, a smaller object)
/// is refused: the plugin writes a pointer into them.
pub fn check_context(
    image: &ElfImage,
    layout: &offload_core::image::elf_dyn::Layout,
) -> Result<bool> {
    check_pointer_variable(image, layout, &BARRIER_SYMBOL.to_string_lossy())?;
    check_pointer_variable(image, layout, &CONTEXT_SYMBOL.to_string_lossy())
}

fn check_pointer_variable(
    image: &ElfImage,
    layout: &offload_core::image::elf_dyn::Layout,
    name: &str,
) -> Result<bool> {
    let Some(s) = image.symbol(name) else {
        return Ok(false);
    };
    let what = if s.is_function {
        "a function".to_string()
    } else if s.size != 8 || s.address % 8 != 0 {
        format!("a {}-byte object at {:#x}", s.size, s.address)
    } else if !layout.is_writable(s.address, 8) {
        "a constant in a read-only segment".to_string()
    } else {
        return Ok(true);
    };
    Err(Error::InvalidImage(format!(
        "the image defines {name} as {what}; that name belongs to a pointer of offload_kernel.h \
         (a writable, 8-byte variable the plugin sets): rename it"
    )))
}
