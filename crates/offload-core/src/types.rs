//! The plain data types the plugin interface speaks: device pointers, handles, launch
//! dimensions, typed kernel arguments and device information.

use crate::error::{Error, Result};
use std::fmt;

/// An address in a device's memory. On the host backend it is a host virtual address; on GPUs
/// it is the driver's device pointer. Never dereferenced by the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// `self + bytes`, or an error on overflow.
    pub fn offset(self, bytes: u64) -> Result<DevicePtr> {
        self.0.checked_add(bytes).map(DevicePtr).ok_or_else(|| {
            Error::InvalidArgument(format!("device pointer {self} + {bytes} overflows"))
        })
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);
    };
}

handle!(
    /// A loaded image on one device. Handles are never reused within a device's lifetime, so a
    /// stale handle is an error, never another program.
    ProgramHandle
);
handle!(
    /// A kernel looked up in a loaded program.
    KernelHandle
);
handle!(
    /// An in-order stream of copies and launches on one device.
    QueueHandle
);
handle!(
    /// A point in a queue's work: recorded on one queue, waited for by another queue or by
    /// the host.
    EventHandle
);

/// A kind of image a plugin serves: routing asks the plugins that claim an image's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageClaim {
    /// Native ELF images of this machine (`e_machine`).
    Elf {
        /// `e_machine`
        machine: u16,
    },
    /// LLVM bitcode and IR for this triple (compiled by the JIT).
    Bitcode {
        /// The target triple.
        triple: String,
    },
    /// PTX text.
    Ptx,
    /// CUDA fat binaries.
    CudaFatbin,
    /// SPIR-V modules.
    SpirV,
}

impl ImageClaim {
    /// One line of the ABI's claim list (`elf:62`, `bitcode:<triple>`, `ptx`, `fatbin`).
    pub fn to_text(&self) -> String {
        match self {
            ImageClaim::Elf { machine } => format!("elf:{machine}"),
            ImageClaim::Bitcode { triple } => format!("bitcode:{triple}"),
            ImageClaim::Ptx => "ptx".into(),
            ImageClaim::CudaFatbin => "fatbin".into(),
            ImageClaim::SpirV => "spirv".into(),
        }
    }

    /// Parses [`ImageClaim::to_text`]; `None` for a claim this runtime does not know.
    pub fn from_text(text: &str) -> Option<Self> {
        let text = text.trim();
        if let Some(m) = text.strip_prefix("elf:") {
            return m.parse().ok().map(|machine| ImageClaim::Elf { machine });
        }
        if let Some(t) = text.strip_prefix("bitcode:") {
            return Some(ImageClaim::Bitcode { triple: t.into() });
        }
        match text {
            "ptx" => Some(ImageClaim::Ptx),
            "fatbin" => Some(ImageClaim::CudaFatbin),
            "spirv" => Some(ImageClaim::SpirV),
            _ => None,
        }
    }

    /// For messages: `ELF EM_X86_64 (62)`, `bitcode for x86_64-unknown-linux-gnu`.
    pub fn describe(&self) -> String {
        match self {
            ImageClaim::Elf { machine } => {
                format!("ELF {}", crate::image::machine::describe(*machine))
            }
            ImageClaim::Bitcode { triple } => format!("bitcode/IR for {triple}"),
            ImageClaim::Ptx => "PTX text".into(),
            ImageClaim::CudaFatbin => "CUDA fatbins".into(),
            ImageClaim::SpirV => "SPIR-V modules".into(),
        }
    }
}

/// Grid and block sizes of a launch, in CUDA's terms (blocks per grid, threads per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Number of blocks in x, y, z.
    pub grid: [u32; 3],
    /// Number of threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes (every backend provides it; the host backend
    /// gives each block its own buffer).
    pub shared_mem_bytes: u32,
}

/// What kind of processor a device is, from its plugin's ELF machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// A host processor (x86-64, AArch64, RISC-V, POWER, z).
    Cpu,
    /// A GPU (NVIDIA, AMD, Intel).
    Gpu,
    /// Anything else (a test backend, an accelerator without a GPU's ELF machine).
    Other,
}

impl DeviceKind {
    /// The kind of the processors that run images of ELF machine `machine`.
    pub fn of_elf_machine(machine: u16) -> DeviceKind {
        match machine {
            // EM_X86_64, EM_AARCH64, EM_RISCV, EM_PPC64, EM_S390, EM_386
            62 | 183 | 243 | 21 | 22 | 3 => DeviceKind::Cpu,
            // EM_CUDA, EM_AMDGPU, EM_INTELGT
            190 | 224 | 205 => DeviceKind::Gpu,
            _ => DeviceKind::Other,
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Other => "other",
        })
    }
}

impl LaunchDims {
    /// A 1-D launch.
    pub fn linear(grid: u32, block: u32) -> Self {
        LaunchDims {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes: 0,
        }
    }

    /// A 1-D launch covering `n` elements with blocks of `block` threads: `ceil(n / block)`
    /// blocks. An error when `block` is 0 or the grid would not fit in 32 bits.
    pub fn for_elems(n: u64, block: u32) -> Result<Self> {
        if block == 0 {
            return Err(Error::InvalidArgument(
                "a launch for elements needs a block of at least 1 thread".into(),
            ));
        }
        let grid = n.div_ceil(u64::from(block)).max(1);
        let grid = u32::try_from(grid).map_err(|_| {
            Error::InvalidArgument(format!(
                "{n} elements in blocks of {block} need {grid} blocks; a grid dimension holds at \
                 most {}",
                u32::MAX
            ))
        })?;
        Ok(LaunchDims::linear(grid, block))
    }

    /// Total number of blocks.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    /// Total number of threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| u64::from(b)).product()
    }

    /// Checks the shape against a device's limits. Zero in any dimension is a caller bug.
    pub fn validate(&self, limits: &DeviceLimits) -> Result<()> {
        for (what, dims, max) in [
            ("grid", self.grid, limits.max_grid),
            ("block", self.block, limits.max_block),
        ] {
            for (axis, (&d, &m)) in ["x", "y", "z"].iter().zip(dims.iter().zip(max.iter())) {
                if d == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "{what} dimension {axis} is 0; every dimension must be at least 1"
                    )));
                }
                if d > m {
                    return Err(Error::InvalidArgument(format!(
                        "{what} dimension {axis} is {d}; the device allows at most {m}"
                    )));
                }
            }
        }
        if self.threads_per_block() > u64::from(limits.max_threads_per_block) {
            return Err(Error::InvalidArgument(format!(
                "block has {} threads; the device allows at most {} per block",
                self.threads_per_block(),
                limits.max_threads_per_block
            )));
        }
        Ok(())
    }
}

impl fmt::Display for LaunchDims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        write!(f, "grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}")
    }
}

/// The scalar types kernel arguments and buffers can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// `int32_t`
    I32,
    /// `uint32_t`
    U32,
    /// `int64_t`
    I64,
    /// `uint64_t`
    U64,
    /// `float`
    F32,
    /// `double`
    F64,
}

impl ScalarType {
    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            ScalarType::I32 | ScalarType::U32 | ScalarType::F32 => 4,
            ScalarType::I64 | ScalarType::U64 | ScalarType::F64 => 8,
        }
    }

    /// The spelling used on the command line and in JSON (`i32`, `f64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::I32 => "i32",
            ScalarType::U32 => "u32",
            ScalarType::I64 => "i64",
            ScalarType::U64 => "u64",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
        }
    }

    /// Parses the spelling of [`ScalarType::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "i32" => ScalarType::I32,
            "u32" => ScalarType::U32,
            "i64" => ScalarType::I64,
            "u64" => ScalarType::U64,
            "f32" => ScalarType::F32,
            "f64" => ScalarType::F64,
            _ => return None,
        })
    }
}

/// One typed kernel argument. GPUs receive these packed into an argument buffer; the host
/// backend needs the types to call a C-ABI function correctly (floats in float registers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// `int32_t`
    I32(i32),
    /// `uint32_t`
    U32(u32),
    /// `int64_t`
    I64(i64),
    /// `uint64_t`
    U64(u64),
    /// `float`
    F32(f32),
    /// `double`
    F64(f64),
    /// A device pointer (`T*` in the kernel).
    Ptr(DevicePtr),
    /// One pointer-sized value that the kernel receives as its parameter is declared, a
    /// pointer or a 64-bit integer: OpenMP's convention, where the caller knows values but not
    /// types (a mapped address, a literal, a pointer into the middle of an allocation or to
    /// host memory under unified shared memory). The layer does not check it against
    /// allocations, and words past a kernel's known parameters are not passed (a C call
    /// ignores them too).
    Word(u64),
}

/// Kind codes of [`KernelArg`] on the ABI (part of the ABI, never reused).
pub mod arg_kind {
    /// [`super::KernelArg::I32`]
    pub const I32: u32 = 1;
    /// [`super::KernelArg::U32`]
    pub const U32: u32 = 2;
    /// [`super::KernelArg::I64`]
    pub const I64: u32 = 3;
    /// [`super::KernelArg::U64`]
    pub const U64: u32 = 4;
    /// [`super::KernelArg::F32`]
    pub const F32: u32 = 5;
    /// [`super::KernelArg::F64`]
    pub const F64: u32 = 6;
    /// [`super::KernelArg::Ptr`]
    pub const PTR: u32 = 7;
    /// [`super::KernelArg::Word`] (ABI 1.4)
    pub const WORD: u32 = 8;
}

impl KernelArg {
    /// The type's spelling (`i32`, `f64`, `ptr`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            KernelArg::I32(_) => "i32",
            KernelArg::U32(_) => "u32",
            KernelArg::I64(_) => "i64",
            KernelArg::U64(_) => "u64",
            KernelArg::F32(_) => "f32",
            KernelArg::F64(_) => "f64",
            KernelArg::Ptr(_) => "ptr",
            KernelArg::Word(_) => "word",
        }
    }

    /// Its value, if it is an integer (what an extent `[n]` of a parameter record reads).
    pub fn integer(&self) -> Option<i128> {
        Some(match *self {
            KernelArg::I32(v) => v.into(),
            KernelArg::U32(v) => v.into(),
            KernelArg::I64(v) => v.into(),
            KernelArg::U64(v) => v.into(),
            _ => return None,
        })
    }

    /// Size of the argument in a packed GPU argument buffer (also its alignment).
    pub fn size(&self) -> usize {
        match self {
            KernelArg::I32(_) | KernelArg::U32(_) | KernelArg::F32(_) => 4,
            _ => 8,
        }
    }

    /// `(kind, bits)` as carried by the ABI.
    pub fn to_bits(&self) -> (u32, u64) {
        match *self {
            KernelArg::I32(v) => (arg_kind::I32, v as u32 as u64),
            KernelArg::U32(v) => (arg_kind::U32, u64::from(v)),
            KernelArg::I64(v) => (arg_kind::I64, v as u64),
            KernelArg::U64(v) => (arg_kind::U64, v),
            KernelArg::F32(v) => (arg_kind::F32, u64::from(v.to_bits())),
            KernelArg::F64(v) => (arg_kind::F64, v.to_bits()),
            KernelArg::Ptr(p) => (arg_kind::PTR, p.0),
            KernelArg::Word(v) => (arg_kind::WORD, v),
        }
    }

    /// Inverse of [`KernelArg::to_bits`]; `index` is only used in the error message.
    pub fn from_bits(kind: u32, bits: u64, index: usize) -> Result<Self> {
        Ok(match kind {
            arg_kind::I32 => KernelArg::I32(bits as u32 as i32),
            arg_kind::U32 => KernelArg::U32(bits as u32),
            arg_kind::I64 => KernelArg::I64(bits as i64),
            arg_kind::U64 => KernelArg::U64(bits),
            arg_kind::F32 => KernelArg::F32(f32::from_bits(bits as u32)),
            arg_kind::F64 => KernelArg::F64(f64::from_bits(bits)),
            arg_kind::PTR => KernelArg::Ptr(DevicePtr(bits)),
            arg_kind::WORD => KernelArg::Word(bits),
            k => {
                return Err(Error::InvalidArgument(format!(
                    "kernel argument {index} has unknown type code {k}"
                )));
            }
        })
    }

    /// Packs arguments the way GPU drivers expect them: each argument at its natural
    /// alignment, in order.
    pub fn pack(args: &[KernelArg]) -> Vec<u8> {
        let mut out = Vec::new();
        for a in args {
            let size = a.size();
            while out.len() % size != 0 {
                out.push(0);
            }
            let (_, bits) = a.to_bits();
            out.extend_from_slice(&bits.to_le_bytes()[..size]);
        }
        out
    }
}

/// Launch limits of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest grid per dimension.
    pub max_grid: [u32; 3],
    /// Largest block per dimension.
    pub max_block: [u32; 3],
    /// Largest product of the block dimensions.
    pub max_threads_per_block: u32,
    /// Threads that execute in lock step (warp/wavefront; 1 on the host).
    pub warp_size: u32,
}

/// What a device is, for users (`offload info`) and for the JIT (compute-unit kind and target
/// features select the code it generates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Human-readable name (`NVIDIA H200`, `AMD EPYC 7B13 (host)`).
    pub name: String,
    /// The exact code-generation target (`sm_90`, `gfx90a`, `x86-64`, `znver3`).
    pub compute_unit_kind: String,
    /// LLVM target features for code generation (`+ptx80`, `+avx2,...`); may be empty.
    pub target_features: String,
    /// Total memory in bytes.
    pub total_memory: u64,
    /// Independent execution units (SMs, CUs, host worker threads).
    pub compute_units: u32,
    /// Launch limits.
    pub limits: DeviceLimits,
}

/// Where an allocation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary device memory.
    Device,
    /// Host memory pinned for fast transfers and visible to the device.
    Host,
    /// Memory migrated on demand between host and device.
    Shared,
}

impl MemoryKind {
    /// ABI code.
    pub fn to_u32(self) -> u32 {
        match self {
            MemoryKind::Device => 0,
            MemoryKind::Host => 1,
            MemoryKind::Shared => 2,
        }
    }

    /// Decodes the ABI code.
    pub fn from_u32(v: u32) -> Result<Self> {
        Ok(match v {
            0 => MemoryKind::Device,
            1 => MemoryKind::Host,
            2 => MemoryKind::Shared,
            _ => return Err(Error::InvalidArgument(format!("unknown memory kind {v}"))),
        })
    }
}

/// A global variable found in a loaded program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalSymbol {
    /// Its device address.
    pub ptr: DevicePtr,
    /// Its size in bytes.
    pub size: u64,
}

/// Counters of a plugin's JIT engine (cache and compiles) since it was made. `repr(C)` with
/// only `u64` fields: it crosses the plugin ABI as it is.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JitStats {
    /// Requests served from memory.
    pub memory_hits: u64,
    /// Requests that waited for another thread's compile of the same key.
    pub shared_waits: u64,
    /// Requests that found nothing and compiled.
    pub misses: u64,
    /// Successful compiles.
    pub compiles: u64,
    /// Failed compiles.
    pub failures: u64,
    /// Total time spent compiling, in nanoseconds.
    pub compile_ns: u64,
    /// Entries in memory.
    pub entries: u64,
    /// Bytes of compiled images in memory.
    pub bytes: u64,
    /// Entries dropped to stay under the capacity.
    pub evictions: u64,
    /// Compiles running now.
    pub in_flight: u64,
    /// Most compiles ever running at once.
    pub peak_in_flight: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_for_elements_cover_them_and_refuse_what_does_not_fit() {
        let mut seq = crate::rand::XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..10_000 {
            let rng = seq.next_u64();
            let n = rng % (1 << (rng % 40));
            let block = (1 + (rng >> 40) % 1024) as u32;
            if n.div_ceil(u64::from(block)) > u64::from(u32::MAX) {
                assert!(LaunchDims::for_elems(n, block).is_err(), "{n} / {block}");
                continue;
            }
            let d = LaunchDims::for_elems(n, block).unwrap();
            let covered = d.blocks() * u64::from(block);
            assert!(covered >= n.max(1), "{n} / {block}: {d:?}");
            assert!(
                covered - n.max(1) < u64::from(block),
                "{n} / {block}: {d:?}"
            );
            assert_eq!((d.grid[1], d.grid[2], d.block), (1, 1, [block, 1, 1]));
        }
        assert_eq!(LaunchDims::for_elems(0, 64).unwrap().grid, [1, 1, 1]);
        assert!(LaunchDims::for_elems(10, 0).is_err());
        let e = LaunchDims::for_elems(u64::MAX, 1).unwrap_err().to_string();
        assert!(e.contains("need 18446744073709551615 blocks"), "{e}");
        assert_eq!(
            LaunchDims::for_elems(u64::from(u32::MAX) * 2, 2)
                .unwrap()
                .grid[0],
            u32::MAX
        );
    }

    #[test]
    fn device_kinds_follow_the_elf_machine() {
        assert_eq!(DeviceKind::of_elf_machine(62), DeviceKind::Cpu);
        assert_eq!(DeviceKind::of_elf_machine(183), DeviceKind::Cpu);
        assert_eq!(DeviceKind::of_elf_machine(190), DeviceKind::Gpu);
        assert_eq!(DeviceKind::of_elf_machine(224), DeviceKind::Gpu);
        assert_eq!(DeviceKind::of_elf_machine(0x7E57), DeviceKind::Other);
        assert_eq!(DeviceKind::Gpu.to_string(), "gpu");
    }

    #[test]
    fn args_round_trip_and_pack_with_alignment() {
        let args = [
            KernelArg::I32(-3),
            KernelArg::F64(2.5),
            KernelArg::F32(1.5),
            KernelArg::Ptr(DevicePtr(0x1000)),
            KernelArg::U32(7),
            KernelArg::I64(-9),
            KernelArg::U64(u64::MAX),
        ];
        for (i, a) in args.iter().enumerate() {
            let (k, b) = a.to_bits();
            assert_eq!(KernelArg::from_bits(k, b, i).unwrap(), *a);
        }
        let packed = KernelArg::pack(&args[..3]);
        assert_eq!(packed.len(), 4 + 4 + 8 + 4);
        assert_eq!(&packed[8..16], &2.5f64.to_le_bytes());
        assert!(
            KernelArg::from_bits(99, 0, 4)
                .unwrap_err()
                .to_string()
                .contains("argument 4")
        );
    }

    #[test]
    fn launch_dims_are_checked_against_limits() {
        let limits = DeviceLimits {
            max_grid: [100, 100, 1],
            max_block: [64, 64, 1],
            max_threads_per_block: 128,
            warp_size: 1,
        };
        assert!(LaunchDims::linear(10, 64).validate(&limits).is_ok());
        let e = LaunchDims::linear(0, 1)
            .validate(&limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("grid dimension x is 0"), "{e}");
        let mut d = LaunchDims::linear(1, 64);
        d.block[1] = 4;
        let e = d.validate(&limits).unwrap_err().to_string();
        assert!(e.contains("256 threads"), "{e}");
        d.block[1] = 1;
        d.grid[2] = 2;
        assert!(
            d.validate(&limits)
                .unwrap_err()
                .to_string()
                .contains("grid dimension z is 2")
        );
    }
}
