//! Host "device" memory: real host allocations, tracked so that every copy and pointer
//! argument can be checked against a live region before it is touched.

use offload_core::{DevicePtr, Error, Result};
use std::alloc::Layout;
use std::collections::BTreeMap;

/// Alignment of every allocation (matches what GPU allocators give).
const ALIGN: usize = 256;

#[derive(Debug)]
enum Region {
    /// Owned by this map, freed with this layout.
    Allocation(Layout),
    /// A global variable of a loaded program (owned by the dynamic loader).
    Global { size: u64, program: u64 },
}

impl Region {
    fn size(&self) -> u64 {
        match self {
            Region::Allocation(l) => l.size() as u64,
            Region::Global { size, .. } => *size,
        }
    }
}

/// The live regions of one device.
#[derive(Debug, Default)]
pub struct MemoryMap {
    regions: BTreeMap<u64, Region>,
    allocated: u64,
}

impl MemoryMap {
    pub fn alloc(&mut self, size: u64, limit: u64, device: usize) -> Result<DevicePtr> {
        if size > limit.saturating_sub(self.allocated) {
            return Err(Error::OutOfMemory(format!(
                "host device {device}: {size} bytes requested, {} of {limit} already allocated",
                self.allocated
            )));
        }
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, ALIGN).ok())
            .ok_or_else(|| Error::OutOfMemory(format!("{size} bytes cannot be allocated here")))?;
        // SAFETY: the layout has a non-zero size (0 is rejected by the ABI layer).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::OutOfMemory(format!(
                "host device {device}: the system allocator refused {size} bytes"
            )));
        }
        self.allocated += size;
        self.regions.insert(p as u64, Region::Allocation(layout));
        Ok(DevicePtr(p as u64))
    }

    pub fn free(&mut self, ptr: DevicePtr, device: usize) -> Result<()> {
        match self.regions.get(&ptr.0) {
            Some(Region::Allocation(layout)) => {
                let layout = *layout;
                self.regions.remove(&ptr.0);
                self.allocated -= layout.size() as u64;
                // SAFETY: `ptr` was returned by `alloc_zeroed` with this layout and is removed
                // from the map, so it is freed exactly once.
                unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
                Ok(())
            }
            Some(Region::Global { .. }) => Err(Error::InvalidArgument(format!(
                "free of {ptr} on host device {device}: that is a program global, not an allocation"
            ))),
            None => Err(Error::InvalidArgument(format!(
                "free of {ptr} on host device {device}: not the start of a live allocation \
                 (double free, or a pointer from another device?)"
            ))),
        }
    }

    pub fn add_global(&mut self, ptr: u64, size: u64, program: u64) {
        self.regions.insert(ptr, Region::Global { size, program });
    }

    pub fn remove_program_globals(&mut self, program: u64) {
        self.regions
            .retain(|_, r| !matches!(r, Region::Global { program: p, .. } if *p == program));
    }

    /// Checks that `[ptr, ptr + len)` lies inside one live region.
    pub fn check(&self, ptr: DevicePtr, len: u64, what: &str, device: usize) -> Result<()> {
        let end = ptr.0.checked_add(len);
        if let (Some((&start, region)), Some(end)) = (self.regions.range(..=ptr.0).next_back(), end)
            && end <= start + region.size()
        {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{what}: device range {ptr}..+{len} is not inside any live allocation of host device {device}"
        )))
    }
}

impl Drop for MemoryMap {
    fn drop(&mut self) {
        for (&p, r) in &self.regions {
            if let Region::Allocation(layout) = r {
                // SAFETY: every `Allocation` region was made by `alloc_zeroed` with `layout`.
                unsafe { std::alloc::dealloc(p as *mut u8, *layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_frees_validated() {
        let mut m = MemoryMap::default();
        let p = m.alloc(100, 1 << 20, 0).unwrap();
        assert_eq!(p.0 % ALIGN as u64, 0);
        m.check(p, 100, "t", 0).unwrap();
        m.check(p.offset(50).unwrap(), 50, "t", 0).unwrap();
        assert!(m.check(p.offset(50).unwrap(), 51, "t", 0).is_err());
        assert!(m.check(DevicePtr(8), 1, "t", 0).is_err());
        assert!(m.free(p.offset(1).unwrap(), 0).is_err());
        m.free(p, 0).unwrap();
        assert!(
            m.free(p, 0)
                .unwrap_err()
                .to_string()
                .contains("double free")
        );
        assert!(matches!(
            m.alloc(2 << 20, 1 << 20, 0),
            Err(Error::OutOfMemory(_))
        ));
    }
}
