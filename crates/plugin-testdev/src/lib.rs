//! # testdev: the smallest complete offload backend
//!
//! Serves ELF machine [`TESTDEV_MACHINE`] (a number no real architecture uses). Its "devices"
//! keep memory in host vectors at made-up addresses and "run" every kernel the same way: for
//! each work item `i` of the launch (in linear order, `i < G·B`), element `i` of the first
//! pointer argument, as a `u32`, becomes `base + i`, where `base` is the first `i32`/`u32`
//! argument (0 if none). A kernel named `panic` panics, to test that the ABI layer catches it.
//!
//! `OFFLOAD_TESTDEV_MODE` damages the plugin on purpose, for the runtime's ABI tests:
//! `bad-magic`, `bad-major`, `short-table`, `abi-1.0` (a valid table of the oldest minor
//! version, without later entries), `null-entry` (entry returns null), `panic-entry`
//! (the constructor panics), `init-error` (init fails), `no-devices` (init reports 0).
//! `OFFLOAD_TESTDEV_DEVICES` sets the device count (default 2).

use offload_core::image::{ElfRequirements, elf_type};
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, ElfImage, Error, GenericDevice, GenericPlugin,
    GlobalSymbol, KernelArg, KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
    Result,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
    std::env::var("OFFLOAD_TESTDEV_MODE").unwrap_or_default()
}

#[derive(Debug, Default)]
struct TestPlugin {
    devices: OnceLock<Vec<Arc<TestDevice>>>,
}

impl GenericPlugin for TestPlugin {
    fn name(&self) -> &str {
        "testdev"
    }
    fn elf_machine(&self) -> u16 {
        TESTDEV_MACHINE
    }
    fn target_triple(&self) -> &str {
        "testdev-unknown-none"
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
            "no-devices" => return Ok(0),
            _ => {}
        }
        let n = offload_core::env::u32_in_range(&["OFFLOAD_TESTDEV_DEVICES"], 0, 16, 2)?;
        Ok(self
            .devices
            .get_or_init(|| {
                (0..n as usize)
                    .map(|i| Arc::new(TestDevice::new(i)))
                    .collect()
            })
            .len())
    }
    fn check_image(&self, image: &[u8]) -> Result<()> {
        ElfImage::parse(image, &requirements()).map(|_| ())
    }
    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        Ok(self.devices.get().expect("init ran")[index].clone())
    }
}

#[derive(Debug)]
struct TestDevice {
    index: usize,
    next: AtomicU64,
    programs: Mutex<HashMap<u64, ElfImage>>,
    kernels: Mutex<HashMap<u64, String>>,
    memory: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl TestDevice {
    fn new(index: usize) -> Self {
        TestDevice {
            index,
            next: AtomicU64::new(1),
            programs: Mutex::default(),
            kernels: Mutex::default(),
            memory: Mutex::default(),
        }
    }

    /// Runs `f` on the bytes `[ptr, ptr + len)` of the allocation containing them.
    fn with_range<T>(&self, ptr: DevicePtr, len: u64, f: impl FnOnce(&mut [u8]) -> T) -> Result<T> {
        let mut mem = self.memory.lock().unwrap();
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

impl GenericDevice for TestDevice {
    fn index(&self) -> usize {
        self.index
    }
    fn info(&self) -> Result<DeviceInfo> {
        Ok(DeviceInfo {
            name: format!("testdev virtual device {}", self.index),
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
    fn check_image(&self, image: &[u8]) -> Result<()> {
        ElfImage::parse(image, &requirements()).map(|_| ())
    }
    fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        let parsed = ElfImage::parse(image, &requirements())?;
        let h = self.next.fetch_add(1, Ordering::Relaxed);
        self.programs.lock().unwrap().insert(h, parsed);
        Ok(ProgramHandle(h))
    }
    fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        self.programs
            .lock()
            .unwrap()
            .remove(&program.0)
            .map(|_| ())
            .ok_or_else(|| Error::NotFound(format!("testdev program {}", program.0)))
    }
    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        let programs = self.programs.lock().unwrap();
        let image = programs
            .get(&program.0)
            .ok_or_else(|| Error::NotFound(format!("testdev program {}", program.0)))?;
        if !image.symbol(name).is_some_and(|s| s.is_function) {
            return Err(Error::NotFound(format!(
                "kernel '{name}' is not in the testdev image"
            )));
        }
        let h = self.next.fetch_add(1, Ordering::Relaxed);
        self.kernels.lock().unwrap().insert(h, name.to_string());
        Ok(KernelHandle(h))
    }
    fn global(&self, _program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        Err(Error::Unsupported(format!(
            "testdev has no globals ('{name}')"
        )))
    }
    fn alloc(&self, size: u64, _kind: MemoryKind) -> Result<DevicePtr> {
        // Addresses are spaced 1 GiB apart so that out-of-bounds offsets never alias.
        let addr = self.next.fetch_add(1, Ordering::Relaxed) << 30;
        self.memory
            .lock()
            .unwrap()
            .insert(addr, vec![0; size as usize]);
        Ok(DevicePtr(addr))
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.memory
            .lock()
            .unwrap()
            .remove(&ptr.0)
            .map(|_| ())
            .ok_or_else(|| Error::InvalidArgument(format!("testdev: free of unallocated {ptr}")))
    }
    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        _q: Option<QueueHandle>,
    ) -> Result<()> {
        // SAFETY: `src` is valid for `len` bytes by the trait contract.
        let src = unsafe { std::slice::from_raw_parts(src, len) };
        self.with_range(dst, len as u64, |d| d.copy_from_slice(src))
    }
    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        _q: Option<QueueHandle>,
    ) -> Result<()> {
        // SAFETY: `dst` is valid for `len` bytes by the trait contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        self.with_range(src, len as u64, |s| dst.copy_from_slice(s))
    }
    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        _q: Option<QueueHandle>,
    ) -> Result<()> {
        let data = self.with_range(src, len, |s| s.to_vec())?;
        self.with_range(dst, len, |d| d.copy_from_slice(&data))
    }
    fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        _q: Option<QueueHandle>,
    ) -> Result<()> {
        let name = self
            .kernels
            .lock()
            .unwrap()
            .get(&kernel.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("testdev kernel {}", kernel.0)))?;
        if name == "panic" {
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
    fn queue_create(&self) -> Result<QueueHandle> {
        Ok(QueueHandle(self.next.fetch_add(1, Ordering::Relaxed)))
    }
    fn queue_synchronize(&self, _queue: QueueHandle) -> Result<()> {
        Ok(())
    }
    fn queue_destroy(&self, _queue: QueueHandle) -> Result<()> {
        Ok(())
    }
}

/// The entry symbol, written by hand (instead of `export_plugin!`) so that the tests can
/// damage the table the way a broken or foreign plugin would.
#[unsafe(no_mangle)]
pub extern "C" fn offload_plugin_entry() -> *const offload_core::abi::PluginTable {
    static TABLE: Mutex<Option<&'static offload_core::abi::PluginTable>> = Mutex::new(None);
    let table = offload_core::abi::export::entry(&TABLE, || {
        if mode() == "panic-entry" {
            panic!("testdev constructor panics (OFFLOAD_TESTDEV_MODE=panic-entry)");
        }
        Box::new(TestPlugin::default())
    });
    if table.is_null() {
        return table;
    }
    // SAFETY: a non-null table from `entry` is a valid, static table.
    let good = unsafe { &*table };
    let damaged = |f: &dyn Fn(&mut offload_core::abi::AbiHeader)| {
        let mut copy = offload_core::abi::PluginTable {
            header: clone_header(&good.header),
            ..*good
        };
        f(&mut copy.header);
        Box::leak(Box::new(copy)) as *const _
    };
    match mode().as_str() {
        "bad-magic" => damaged(&|h| h.magic = u64::from_le_bytes(*b"NOTAPLUG")),
        "bad-major" => damaged(&|h| h.abi_major += 1),
        "short-table" => damaged(&|h| h.table_size = 64),
        "abi-1.0" => damaged(&|h| {
            h.abi_minor = 0;
            h.table_size = offload_core::abi::TABLE_SIZE_1_0 as u32;
        }),
        "null-entry" => std::ptr::null(),
        _ => table,
    }
}

fn clone_header(h: &offload_core::abi::AbiHeader) -> offload_core::abi::AbiHeader {
    offload_core::abi::AbiHeader {
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
