//! Copies to host memory that the device must never write itself: through a staging buffer.
//!
//! A copy to the host is handed memory the program gets back when the call (or the queue
//! scope) returns, settled or not. If the copy engine could still be writing when a wait gives
//! up ([`offload_core::Error::Unsettled`]), it would write memory the program has back. So a backend whose
//! copies to such memory run on the device's own engine (AMD's DMA, Level Zero's copy engine,
//! CUDA's copies into pinned memory) copies into a staging buffer of its own, waits, and the
//! CPU copies the bytes out: a copy that does not settle leaves only the staging buffer to be
//! written, and that is then never freed. One loop for every backend: [`copy_to_host_via`].

use crate::DeviceBackend;
#[cfg(test)]
use offload_core::Error;
use offload_core::{DevicePtr, MemoryKind, Result};

/// The largest staging buffer: a longer copy goes through it in chunks.
pub const STAGING_CHUNK: usize = 64 << 20;

/// [`copy_to_host`] through a staging buffer of `device`'s host memory
/// (`alloc(.., MemoryKind::Host)`, pinned and reachable by the device).
///
/// # Safety
/// `host` is valid for writes of `len` bytes.
pub unsafe fn copy_to_host_via<D: DeviceBackend>(
    device: &D,
    host: *mut u8,
    len: usize,
    fill: impl FnMut(*mut u8, usize, usize) -> Result<()>,
) -> Result<()> {
    // SAFETY: the caller's contract; the staging buffer is a new allocation, apart from
    // `host`, readable for its size until `free`.
    unsafe {
        copy_to_host(
            host,
            len,
            |n| Ok(device.alloc(n as u64, MemoryKind::Host)?.0 as *mut u8),
            fill,
            |at, n| device.free(DevicePtr(at as u64), n as u64, MemoryKind::Host),
        )
    }
}

/// Copies `len` bytes to `host` through a staging buffer of `min(len, STAGING_CHUNK)` bytes
/// (`alloc` makes it, `free` frees it), chunk by chunk: `fill(staging, offset, n)` copies
/// bytes `offset..offset + n` of the source into the staging buffer and returns once that copy
/// has completed (or with its error); the CPU then copies them to `host + offset`.
///
/// A `fill` that fails unsettled ([`offload_core::Error::is_unsettled`]: the engine may still write) leaves
/// the staging buffer allocated for good; any other failure frees it. Either way `host` holds
/// the chunks that completed before, and nothing more is written to it.
///
/// # Safety
/// `host` is valid for writes of `len` bytes and does not overlap the staging buffer; `alloc`
/// returns memory valid for reads of the size it is asked for, which `free` frees.
unsafe fn copy_to_host(
    host: *mut u8,
    len: usize,
    alloc: impl FnOnce(usize) -> Result<*mut u8>,
    mut fill: impl FnMut(*mut u8, usize, usize) -> Result<()>,
    free: impl FnOnce(*mut u8, usize),
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let chunk = len.min(STAGING_CHUNK);
    let staging = alloc(chunk).map_err(|e| {
        e.context(format!(
            "a staging buffer of {chunk} bytes for a copy of {len} bytes to the host"
        ))
    })?;
    let mut done = 0;
    while done < len {
        let n = chunk.min(len - done);
        if let Err(e) = fill(staging, done, n) {
            if !e.is_unsettled() {
                // Not started, or the device's work is lost: nothing writes the buffer.
                free(staging, chunk);
            }
            return Err(if done == 0 {
                e
            } else {
                e.context(format!("after {done} of {len} bytes reached the host"))
            });
        }
        // SAFETY: the copy into the staging buffer has completed; `host` is writable for
        // `len` bytes and does not overlap it (this function's contract); `done + n <= len`.
        unsafe { std::ptr::copy_nonoverlapping(staging, host.add(done), n) };
        done += n;
    }
    free(staging, chunk);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// Runs a staged copy of `len` bytes of a source whose byte `i` is `i % 251`, whose fill
    /// fails at chunk `fail` (unsettled or not), into a host buffer of 0xee; returns the
    /// result, the host bytes and whether the staging buffer was freed.
    fn staged(len: usize, fail: Option<(usize, bool)>) -> (Result<()>, Vec<u8>, bool) {
        let source: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut host = vec![0xeeu8; len];
        let storage = RefCell::new(Vec::new());
        let freed = Cell::new(false);
        let chunks = Cell::new(0);
        // SAFETY: `host` holds `len` bytes; the staging buffer is `storage`'s, apart from it.
        let out = unsafe {
            copy_to_host(
                host.as_mut_ptr(),
                len,
                |n| {
                    storage.borrow_mut().resize(n, 0);
                    Ok(storage.borrow_mut().as_mut_ptr())
                },
                |at, offset, n| {
                    let i = chunks.get();
                    chunks.set(i + 1);
                    if let Some((c, unsettled)) = fail
                        && c == i
                    {
                        return Err(if unsettled {
                            Error::DeviceFailure("the wait gave up".into()).unsettled()
                        } else {
                            Error::DeviceFailure("lost".into())
                        });
                    }
                    std::ptr::copy_nonoverlapping(source[offset..].as_ptr(), at, n);
                    Ok(())
                },
                |_, n| {
                    assert_eq!(n, len.min(STAGING_CHUNK));
                    freed.set(true)
                },
            )
        };
        (out, host, freed.get())
    }

    #[test]
    fn every_byte_arrives_in_chunks_and_the_buffer_is_freed_once() {
        for len in [
            1,
            4096,
            STAGING_CHUNK,
            STAGING_CHUNK + 1,
            2 * STAGING_CHUNK + 12_345,
        ] {
            let (out, host, freed) = staged(len, None);
            out.unwrap();
            assert!(freed, "{len}");
            assert!(
                host.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
                "{len}"
            );
        }
        let (out, host, freed) = staged(0, None);
        assert!(out.is_ok() && host.is_empty() && !freed);
    }

    #[test]
    fn a_chunk_that_does_not_settle_keeps_the_buffer_and_writes_nothing_more() {
        let len = 2 * STAGING_CHUNK + 10;
        for (chunk, unsettled) in [(0, true), (1, true), (2, true), (0, false), (2, false)] {
            let (out, host, freed) = staged(len, Some((chunk, unsettled)));
            let e = out.unwrap_err();
            assert_eq!(e.is_unsettled(), unsettled, "{e}");
            assert_eq!(freed, !unsettled, "chunk {chunk}: {e}");
            if chunk > 0 {
                assert!(e.to_string().contains("reached the host"), "{e}");
            }
            let arrived = chunk * STAGING_CHUNK;
            assert!(
                host[..arrived]
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == (i % 251) as u8)
            );
            assert!(host[arrived..].iter().all(|&b| b == 0xee), "chunk {chunk}");
        }
    }
}
