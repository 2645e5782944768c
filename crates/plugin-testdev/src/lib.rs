//! # testdev: the smallest complete offload backend
//!
//! A crate of hooks on the generic device layer (`plugin-common`). Serves ELF machine
//! [`TESTDEV_MACHINE`] (a number no real architecture uses). Its "devices" keep memory in host
//! vectors at made-up addresses and "run" every kernel the same way: for each work item `i` of
//! the launch (in linear order, `i < G·B`), element `i` of the first pointer argument, as a
//! `u32`, becomes `base + i`, where `base` is the first `i32`/`u32` argument (0 if none). A
//! kernel named `panic` panics, to test that panics are caught (on the caller's thread, and on
//! a queue, which then fails).
//!
//! `OFFLOAD_TESTDEV_MODE` damages the plugin on purpose, for the runtime's ABI tests:
//! `bad-magic`, `bad-major`, `short-table` (table_size below 1.0), `abi-1.0` and `abi-1.1`
//! (genuinely shorter tables of older minor versions, ending at a guard page so that a read
//! past them faults), `abi-1.3` (a whole table that says 1.3, which has no word arguments), `null-entry` (entry returns null), `null-launch` and `null-jit-stats`
//! (a required entry is null), `panic-entry` (the constructor panics), `init-error` (init
//! fails), `huge-init-error` (init fails with a 100 KiB message), `no-devices` (init reports 0), `many-devices` (init reports 2^32 - 1),
//! `odd-strings` (device names with a newline and a terminal escape), `gpu-like` (the devices
//! say their work outlives the call, as a GPU's does: `locks_regions` is false).
//! `OFFLOAD_TESTDEV_DEVICES` sets the device count (default 2).

use offload_abi::{AbiHeader, PluginTable, TABLE_SIZE_1_0, TABLE_SIZE_1_1, TABLE_SIZE_1_3};
use offload_core::image::{ElfRequirements, ImageKind, elf_type};
use offload_core::jit::ParamType;
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, ElfImage, Error, GlobalSymbol, ImageClaim, KernelArg,
    MemoryKind, Result,
};
use offload_plugin_common::{Backend, DeviceBackend, Op, Plugin};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The ELF machine testdev serves ("TEST" in spirit).
pub const TESTDEV_MACHINE: u16 = 0x7E57;

fn requirements() -> ElfRequirements<'static> {
    ElfRequirements {
        plugin: "testdev",
        machine: TESTDEV_MACHINE,
        file_types: &[elf_type::DYN],
    }
}

fn mode() -> String {
    offload_core::env::raw(&["OFFLOAD_TESTDEV_MODE"])
        .ok()
        .flatten()
        .map(|(_, v)| v)
        .unwrap_or_default()
}

#[derive(Debug, Default)]
struct TestBackend;

impl Backend for TestBackend {
    type Device = TestDevice;

    fn name(&self) -> &'static str {
        "testdev"
    }
    fn elf_machine(&self) -> u16 {
        TESTDEV_MACHINE
    }
    fn target_triple(&self) -> &'static str {
        "testdev-unknown-none"
    }
    fn claims(&self) -> Vec<ImageClaim> {
        vec![ImageClaim::Elf {
            machine: TESTDEV_MACHINE,
        }]
    }
    fn init(&self) -> Result<usize> {
        match mode().as_str() {
            "init-error" => {
                return Err(Error::Driver {
                    code: 999,
                    message: "testdev driver refused to start (OFFLOAD_TESTDEV_MODE=init-error)"
                        .into(),
                });
            }
            // A message longer than the runtime believes (it keeps 64 KiB and says so).
            "huge-init-error" => {
                return Err(Error::Driver {
                    code: 998,
                    message: "x".repeat(100 << 10),
                });
            }
            "no-devices" => return Ok(0),
            // A count no machine has: the runtime must not believe it.
            "many-devices" => return Ok(u32::MAX as usize),
            _ => {}
        }
        Ok(offload_core::env::u32_in_range(&["OFFLOAD_TESTDEV_DEVICES"], 0, 16, 2)? as usize)
    }
    fn device(&self, index: usize) -> Result<TestDevice> {
        Ok(TestDevice {
            index,
            next: AtomicU64::new(1),
            memory: Mutex::default(),
        })
    }
    fn check_native(&self, image: &[u8], _kind: &ImageKind) -> Result<()> {
        ElfImage::parse(image, &requirements()).map(|_| ())
    }
}

#[derive(Debug)]
struct TestDevice {
    index: usize,
    next: AtomicU64,
    memory: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl TestDevice {
    /// Runs `f` on the bytes `[ptr, ptr + len)` of the allocation containing them.
    fn with_range<T>(&self, ptr: DevicePtr, len: u64, f: impl FnOnce(&mut [u8]) -> T) -> Result<T> {
        let mut mem = offload_core::sync::lock(&self.memory);
        let (&start, buf) = mem
            .range_mut(..=ptr.0)
            .next_back()
            .ok_or_else(|| Error::InvalidArgument(format!("testdev: {ptr} is not allocated")))?;
        let off = (ptr.0 - start) as usize;
        if off as u64 + len > buf.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "testdev: {ptr}..+{len} is out of bounds"
            )));
        }
        Ok(f(&mut buf[off..off + len as usize]))
    }
}

impl DeviceBackend for TestDevice {
    type Program = ElfImage;
    type Kernel = String;
    type Stream = ();

    fn info(&self) -> Result<DeviceInfo> {
        Ok(DeviceInfo {
            // `odd-strings`: a name that tries to forge a line of `offload info`.
            name: if mode() == "odd-strings" {
                format!("testdev {}\nnote: forged line\u{1b}[2J", self.index)
            } else {
                format!("testdev virtual device {}", self.index)
            },
            compute_unit_kind: "test1".into(),
            target_features: "+virtual".into(),
            total_memory: 64 << 20,
            compute_units: 1,
            limits: DeviceLimits {
                max_grid: [65535, 65535, 65535],
                max_block: [1024, 1024, 64],
                max_threads_per_block: 1024,
                warp_size: 1,
            },
        })
    }
    fn check_native(&self, image: &[u8], _kind: &ImageKind) -> Result<()> {
        ElfImage::parse(image, &requirements()).map(|_| ())
    }
    fn load(&self, image: &[u8], _kind: &ImageKind) -> Result<ElfImage> {
        ElfImage::parse(image, &requirements())
    }
    fn kernel(&self, image: &ElfImage, name: &str) -> Result<(String, Option<Vec<ParamType>>)> {
        if !image.symbol(name).is_some_and(|s| s.is_function) {
            return Err(Error::NotFound(format!(
                "kernel '{name}' is not in the testdev image"
            )));
        }
        Ok((name.to_string(), None))
    }
    fn global(&self, _image: &ElfImage, name: &str) -> Result<GlobalSymbol> {
        Err(Error::Unsupported(format!(
            "testdev has no globals ('{name}')"
        )))
    }
    fn alloc(&self, size: u64, _kind: MemoryKind) -> Result<DevicePtr> {
        // Addresses are spaced 1 GiB apart so that out-of-bounds offsets never alias.
        let addr = self.next.fetch_add(1, Ordering::Relaxed) << 30;
        let mut buf = Vec::new();
        buf.try_reserve_exact(size as usize)
            .map_err(|_| Error::OutOfMemory(format!("testdev: {size} bytes")))?;
        buf.resize(size as usize, 0);
        offload_core::sync::lock(&self.memory).insert(addr, buf);
        Ok(DevicePtr(addr))
    }
    fn host_address(&self, ptr: DevicePtr) -> Option<*mut u8> {
        // The allocation holding `ptr` (the layer checked that one does); its bytes never
        // move (an allocation is never resized).
        let mut memory = offload_core::sync::lock(&self.memory);
        let (base, buf) = memory.range_mut(..=ptr.0).next_back()?;
        let at = usize::try_from(ptr.0 - *base).ok()?;
        (at <= buf.len()).then(|| buf.as_mut_ptr().wrapping_add(at))
    }

    fn free(&self, ptr: DevicePtr, _size: u64, _kind: MemoryKind) {
        offload_core::sync::lock(&self.memory).remove(&ptr.0);
    }
    fn stream_create(&self) -> Result<()> {
        Ok(())
    }
    fn locks_regions(&self) -> bool {
        mode() != "gpu-like"
    }
    fn execute(&self, op: Op<'_, Self>, _stream: Option<&()>) -> Result<()> {
        match op {
            Op::CopyToDevice { dst, src, len } => {
                // SAFETY: `src` is valid for `len` bytes by the `copy_to_device` contract.
                let src = unsafe { std::slice::from_raw_parts(src.0 as *const u8, len) };
                self.with_range(dst, len as u64, |d| d.copy_from_slice(src))
            }
            Op::CopyFromDevice { dst, src, len } => {
                // SAFETY: `dst` is valid for `len` bytes by the `copy_from_device` contract.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst.0, len) };
                self.with_range(src, len as u64, |s| dst.copy_from_slice(s))
            }
            Op::CopyDeviceToDevice { dst, src, len } => {
                let data = self.with_range(src, len, |s| s.to_vec())?;
                self.with_range(dst, len, |d| d.copy_from_slice(&data))
            }
            Op::Launch {
                kernel, dims, args, ..
            } => {
                if kernel == "panic" {
                    panic!("testdev kernel 'panic' was launched");
                }
                let base = args
                    .iter()
                    .find_map(|a| match a {
                        KernelArg::I32(v) => Some(*v as u32),
                        KernelArg::U32(v) => Some(*v),
                        _ => None,
                    })
                    .unwrap_or(0);
                let Some(out) = args.iter().find_map(|a| match a {
                    KernelArg::Ptr(p) => Some(*p),
                    // Like a real driver's, a word is the 8 bytes of whatever the kernel takes.
                    KernelArg::Word(w) => Some(DevicePtr(*w)),
                    _ => None,
                }) else {
                    return Ok(());
                };
                let items = dims.blocks() * dims.threads_per_block();
                self.with_range(out, items * 4, |d| {
                    for (i, chunk) in d.chunks_exact_mut(4).enumerate() {
                        chunk.copy_from_slice(&base.wrapping_add(i as u32).to_le_bytes());
                    }
                })
            }
        }
    }
}

/// A copy of the first `size` bytes of `table` placed so that it ends exactly at a page that
/// cannot be read: a runtime that reads past the size the table declares faults.
fn guarded_copy(table: &PluginTable, size: usize, minor: u16) -> *const PluginTable {
    // SAFETY: sysconf has no preconditions; mmap of fresh anonymous memory; the copy stays
    // inside the first page (size < page size) and the second page is made inaccessible.
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        assert!(size <= page);
        let base = libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return std::ptr::null();
        }
        let start = (base as *mut u8).add(page - size);
        std::ptr::copy_nonoverlapping(table as *const PluginTable as *const u8, start, size);
        let header = start as *mut AbiHeader;
        (*header).abi_minor = minor;
        (*header).table_size = size as u32;
        libc::mprotect((base as *mut u8).add(page).cast(), page, libc::PROT_NONE);
        start as *const PluginTable
    }
}

/// The entry symbol, written by hand (instead of `export_backend!`) so that the tests can
/// damage the table the way a broken or foreign plugin would.
#[unsafe(no_mangle)]
pub extern "C" fn offload_plugin_entry() -> *const PluginTable {
    static TABLE: Mutex<Option<&'static PluginTable>> = Mutex::new(None);
    // SAFETY: the test backend keeps the hooks' contract (its memory is host memory it
    // allocates; its operations are plain copies), and only the layer uses its devices.
    let table = unsafe {
        offload_abi::export::entry(&TABLE, || {
            if mode() == "panic-entry" {
                panic!("testdev constructor panics (OFFLOAD_TESTDEV_MODE=panic-entry)");
            }
            Box::new(Plugin::new(TestBackend))
        })
    };
    if table.is_null() {
        return table;
    }
    // SAFETY: a non-null table from `entry` is a valid, static table.
    let good = unsafe { &*table };
    let damaged = |f: &dyn Fn(&mut PluginTable)| {
        let mut copy = PluginTable {
            header: clone_header(&good.header),
            ..*good
        };
        f(&mut copy);
        Box::leak(Box::new(copy)) as *const _
    };
    match mode().as_str() {
        "bad-magic" => damaged(&|t| t.header.magic = u64::from_le_bytes(*b"NOTAPLUG")),
        "bad-major" => damaged(&|t| t.header.abi_major += 1),
        "short-table" => damaged(&|t| t.header.table_size = 64),
        "null-launch" => damaged(&|t| t.launch = None),
        "null-jit-stats" => damaged(&|t| t.jit_stats = None),
        "abi-1.0" => guarded_copy(good, TABLE_SIZE_1_0, 0),
        "abi-1.1" => guarded_copy(good, TABLE_SIZE_1_1, 1),
        // A 1.3 table (1.3 and 1.4 have the same entries) that says 1.3: the runtime must not
        // send it 1.4's word arguments, and it has no event timing (1.5).
        "abi-1.3" => guarded_copy(good, TABLE_SIZE_1_3, 3),
        "null-entry" => std::ptr::null(),
        _ => table,
    }
}

fn clone_header(h: &AbiHeader) -> AbiHeader {
    AbiHeader {
        magic: h.magic,
        abi_major: h.abi_major,
        abi_minor: h.abi_minor,
        table_size: h.table_size,
        elf_machine: h.elf_machine,
        reserved: h.reserved,
        name: h.name,
        target_triple: h.target_triple,
        build_id: h.build_id,
    }
}
