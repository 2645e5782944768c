//! The C types of LLVM 19's host ABI, as clang-19 lays them out (x86-64 LP64; LLVM's
//! `offload/include/Shared/APITypes.h` and `omptarget.h`): the offload entries, device images
//! and binary descriptor that registration hands over, the kernel-argument block of a target
//! region, and the map-type bits. Sizes are pinned by the tests below.

use std::ffi::{c_char, c_void};

/// One entry of an offload table (`__tgt_offload_entry`, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OffloadEntry {
    /// Host address: a kernel's region id, or a global's host copy (NULL for the requires entry).
    pub addr: *mut c_void,
    /// The symbol's name in the device image.
    pub name: *const c_char,
    /// 0 for a kernel; a global's size in bytes.
    pub size: usize,
    /// `OMP_DECLARE_TARGET_LINK` 0x1, `..._INDIRECT` 0x8, `OMP_REGISTER_REQUIRES` 0x10.
    pub flags: i32,
    /// The requires flags of a requires entry.
    pub data: i32,
}

/// `flags` of a requires entry.
pub const ENTRY_REGISTER_REQUIRES: i32 = 0x10;
/// `flags` of an indirect function.
pub const ENTRY_INDIRECT: i32 = 0x8;

/// One device image (`__tgt_device_image`, 32 bytes): `[start, end)` is the image itself (the
/// raw ELF or bitcode, not its offload-binary wrapper); the entries are the host table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceImage {
    pub image_start: *const u8,
    pub image_end: *const u8,
    pub entries_begin: *const OffloadEntry,
    pub entries_end: *const OffloadEntry,
}

/// What a program registers (`__tgt_bin_desc`, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BinDesc {
    pub num_device_images: i32,
    pub device_images: *const DeviceImage,
    pub host_entries_begin: *const OffloadEntry,
    pub host_entries_end: *const OffloadEntry,
}

/// `KernelArgsTy::Flags.NoWait`: the construct has `nowait` (it runs in a target task).
pub const KERNEL_FLAG_NOWAIT: u64 = 1;

/// The arguments of a target region (`KernelArgsTy`, version 3 is 104 bytes; versions 1 and 2
/// stop before `dyn_cgroup_mem` and at `flags`, as the legacy entry points build them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelArgs {
    pub version: u32,
    pub num_args: u32,
    pub arg_base_ptrs: *mut *mut c_void,
    pub arg_ptrs: *mut *mut c_void,
    pub arg_sizes: *mut i64,
    pub arg_types: *mut i64,
    pub arg_names: *mut *mut c_void,
    pub arg_mappers: *mut *mut c_void,
    pub tripcount: u64,
    pub flags: u64,
    pub num_teams: [u32; 3],
    pub thread_limit: [u32; 3],
    pub dyn_cgroup_mem: u32,
}

/// `ident_t`: a source location.
#[repr(C)]
#[derive(Debug)]
pub struct Ident {
    pub reserved_1: i32,
    pub flags: i32,
    pub reserved_2: i32,
    pub reserved_3: i32,
    /// `";file;function;line;column;;"`.
    pub psource: *const c_char,
}

/// `__tgt_target_non_contig`: one dimension of a non-contiguous `target update`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NonContig {
    pub offset: u64,
    pub count: u64,
    pub stride: u64,
}

/// Map-type bits (`omptarget.h`).
pub mod map {
    pub const TO: i64 = 0x001;
    pub const FROM: i64 = 0x002;
    pub const ALWAYS: i64 = 0x004;
    pub const DELETE: i64 = 0x008;
    pub const PTR_AND_OBJ: i64 = 0x010;
    pub const TARGET_PARAM: i64 = 0x020;
    pub const RETURN_PARAM: i64 = 0x040;
    pub const PRIVATE: i64 = 0x080;
    pub const LITERAL: i64 = 0x100;
    pub const IMPLICIT: i64 = 0x200;
    pub const CLOSE: i64 = 0x400;
    pub const PRESENT: i64 = 0x1000;
    pub const OMPX_HOLD: i64 = 0x2000;
    pub const NON_CONTIG: i64 = 0x1000_0000_0000;

    /// The parent index of a `MEMBER_OF` entry, if it is one.
    pub fn member_of(t: i64) -> Option<usize> {
        let p = ((t as u64) >> 48) as usize;
        (p != 0).then(|| p - 1)
    }
}

/// `OMP_TGT_SUCCESS` / `OFFLOAD_SUCCESS`.
pub const SUCCESS: i32 = 0;
/// `OMP_TGT_FAIL` / `OFFLOAD_FAIL`.
pub const FAIL: i32 = !0;

/// Requires flags (`Shared/Requirements.h`).
pub mod requires {
    pub const NONE: i64 = 0x1;
    pub const REVERSE_OFFLOAD: i64 = 0x2;
    pub const UNIFIED_ADDRESS: i64 = 0x4;
    pub const UNIFIED_SHARED_MEMORY: i64 = 0x8;
    pub const DYNAMIC_ALLOCATORS: i64 = 0x10;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_llvm_19s() {
        assert_eq!(std::mem::size_of::<OffloadEntry>(), 32);
        assert_eq!(std::mem::size_of::<DeviceImage>(), 32);
        assert_eq!(std::mem::size_of::<BinDesc>(), 32);
        assert_eq!(std::mem::size_of::<KernelArgs>(), 104);
        assert_eq!(std::mem::offset_of!(KernelArgs, tripcount), 56);
        assert_eq!(std::mem::offset_of!(KernelArgs, num_teams), 72);
        assert_eq!(std::mem::offset_of!(KernelArgs, dyn_cgroup_mem), 96);
        assert_eq!(std::mem::size_of::<NonContig>(), 24);
        assert_eq!(map::member_of(0x1000000000003), Some(0));
        assert_eq!(map::member_of(0x23), None);
    }
}
