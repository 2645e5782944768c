//! Typed device memory: [`DeviceBuffer`] and its views by range, [`BufferView`] and
//! [`BufferViewMut`], for plain-data element types ([`DeviceCopy`]).
//!
//! Every operation checks lengths and ranges and returns an error, never panics. Copies to and
//! from the host, fills and device-to-device copies work on a whole buffer or on any view; the
//! same views are kernel arguments ([`crate::Launch::arg`]): a mutable view (or `&mut` buffer)
//! where the kernel writes, a shared one where it only reads.

use crate::params::CType;
use offload_core::{DevicePtr, Error, GenericDevice, KernelArg, Result};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// Plain data that can live in device memory and cross to and from the host as its bytes.
///
/// # Safety
/// Implement it only for `Copy` types without padding bytes, for which every bit pattern (all
/// zeros included) is a valid value and that hold no pointers or references: their bytes are
/// copied as they are, and device memory comes back as whatever the kernel left.
/// Integers, floats and arrays of them are (implemented here). `ELEMENT`, when given, must
/// describe the type exactly: `n` values of `c` that fill all of `T` (`c.size() * n ==
/// size_of::<T>()`); one that does not add up is ignored (the checked launch then refuses the
/// type), so a wrong `ELEMENT` cannot let a launch past a buffer.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {
    /// The C arithmetic type this is made of and how many of it (`[f32; 4]`: `float`, 4), if
    /// it is made of one; a checked launch matches it against the kernel's element type.
    /// Leave it `None` for other types: they pass only unchecked launches.
    const ELEMENT: Option<(CType, usize)> = None;
}

macro_rules! device_copy {
    ($($t:ty => $c:ident),*) => { $(
        // SAFETY: every bit pattern is a valid value; no pointers.
        unsafe impl DeviceCopy for $t {
            const ELEMENT: Option<(CType, usize)> = Some((CType::$c, 1));
        }
    )* };
}
device_copy!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, f32 => F32, f64 => F64);
// SAFETY: every bit pattern is a valid value; no pointers. (No C element type is 128 bits.)
unsafe impl DeviceCopy for u128 {}
// SAFETY: as for u128.
unsafe impl DeviceCopy for i128 {}
// SAFETY: an array of plain data is plain data.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {
    const ELEMENT: Option<(CType, usize)> = match T::ELEMENT {
        Some((c, n)) => Some((c, n * N)),
        None => None,
    };
}

/// `T::ELEMENT` if it adds up to `T`'s size, else `None` (the checked launch then refuses
/// the type).
pub(crate) const fn element_of<T: DeviceCopy>() -> Option<(CType, usize)> {
    match T::ELEMENT {
        Some((c, n)) => match c.size().checked_mul(n) {
            Some(size) if size == std::mem::size_of::<T>() => Some((c, n)),
            _ => None,
        },
        None => None,
    }
}

pub(crate) fn bytes_of<T: DeviceCopy>(data: &[T]) -> &[u8] {
    // SAFETY: `T` is plain data (`DeviceCopy`): its bytes may be read; the length is the
    // slice's size in bytes.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn bytes_of_mut<T: DeviceCopy>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: `T` is plain data: any bytes written make valid values; exclusive borrow.
    unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    }
}

/// `len` elements of `T` in device memory, freed when dropped. `DeviceBuffer` alone is a
/// buffer of bytes ([`crate::Device::alloc_buffer`]); [`crate::Device::alloc`] and
/// [`crate::Device::upload`] make typed ones. Reads and writes check lengths and return an
/// error, never panic.
pub struct DeviceBuffer<T: DeviceCopy = u8> {
    device: Arc<dyn GenericDevice>,
    ptr: DevicePtr,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: DeviceCopy> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({}, {} elements)",
            std::any::type_name::<T>(),
            self.ptr,
            self.len
        )
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Takes ownership of an allocation of `len` elements at `ptr` (freed when dropped).
    pub(crate) fn from_raw(device: Arc<dyn GenericDevice>, ptr: DevicePtr, len: usize) -> Self {
        DeviceBuffer {
            device,
            ptr,
            len,
            _t: PhantomData,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// As a raw kernel argument (`T *` in the kernel), for [`crate::Launch::arg_raw`] (an unchecked
    /// launch).
    pub fn arg(&self) -> KernelArg {
        KernelArg::Ptr(self.ptr)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    /// The whole buffer as a view.
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            device: &self.device,
            ptr: self.ptr,
            len: self.len,
            host: false,
            exclusive: false,
            read_only: false,
            _t: PhantomData,
        }
    }

    /// The elements in `range`, for copies and as a kernel argument the kernel only reads (an
    /// error if the range is not inside the buffer).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'_, T>> {
        self.view().slice(range)
    }

    /// The buffer as two mutable views, `[..mid)` and `[mid..)` (an error if `mid` is past the
    /// end): disjoint ranges a kernel may write at the same time.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(BufferViewMut<'_, T>, BufferViewMut<'_, T>)> {
        let (a, b) = self.view().split(mid)?;
        Ok((a.into_mut(), b.into_mut()))
    }

    /// The elements in `range`, as a kernel argument the kernel may write.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<BufferViewMut<'_, T>> {
        Ok(self.view().slice(range)?.into_mut())
    }

    /// Copies `data` into the buffer (an error unless their lengths are equal; a part of the
    /// buffer is written through `slice(..n)`).
    pub fn write(&self, data: &[T]) -> Result<()> {
        self.view().write(data)
    }

    /// Copies the buffer into `out` (an error unless their lengths are equal; a part of the
    /// buffer is read through `slice(..n)`).
    pub fn read(&self, out: &mut [T]) -> Result<()> {
        self.view().read(out)
    }

    /// The whole buffer, on the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.view().to_vec()
    }

    /// Sets every element to `value`.
    pub fn fill(&self, value: T) -> Result<()> {
        self.view().fill(value)
    }

    /// Copies all of `src` (a buffer or view of the same device, of this buffer's length) into
    /// this one, on the device.
    pub fn copy_from<'s>(&self, src: impl Into<BufferView<'s, T>>) -> Result<()> {
        self.view().copy_from(src)
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        tracing::info!(target: "offload::memory", "freed {} bytes at {}", self.size(), self.ptr);
        // SAFETY: the buffer owns its allocation, and every borrow of it (views, host slices,
        // queued work through a scope) ended before it could be dropped; work queued on it
        // keeps the memory alive in the layer until it has run.
        let _ = unsafe { self.device.free(self.ptr) };
    }
}

/// A range of a [`DeviceBuffer`] ([`DeviceBuffer::slice`]): an end of copies, and a kernel
/// argument the kernel only reads. Its operations are those of a buffer, on the range.
pub struct BufferView<'a, T: DeviceCopy> {
    device: &'a Arc<dyn GenericDevice>,
    ptr: DevicePtr,
    len: usize,
    /// Memory the host reads directly ([`HostBuffer`]): device work writes it only through
    /// an exclusive borrow, so no host reference sees it change.
    host: bool,
    /// The view comes from an exclusive borrow ([`BufferViewMut`]).
    exclusive: bool,
    /// Memory nothing may write through this view: a program's global
    /// ([`crate::Program::global`]), which may be read-only data of the image.
    read_only: bool,
    _t: PhantomData<&'a [T]>,
}

impl<T: DeviceCopy> Clone for BufferView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: DeviceCopy> Copy for BufferView<'_, T> {}

impl<T: DeviceCopy> std::fmt::Debug for BufferView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BufferView<{}>({}, {} elements)",
            std::any::type_name::<T>(),
            self.ptr,
            self.len
        )
    }
}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for BufferView<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        b.view()
    }
}

impl<'a, T: DeviceCopy> From<&'a mut DeviceBuffer<T>> for BufferView<'a, T> {
    fn from(b: &'a mut DeviceBuffer<T>) -> Self {
        b.view()
    }
}

impl<'a, T: DeviceCopy> From<BufferViewMut<'a, T>> for BufferView<'a, T> {
    fn from(v: BufferViewMut<'a, T>) -> Self {
        v.view
    }
}

impl<'a, T: DeviceCopy> BufferView<'a, T> {
    /// A view of `len` elements at `ptr`, memory of `device` that outlives `'a`.
    pub(crate) fn from_raw(device: &'a Arc<dyn GenericDevice>, ptr: DevicePtr, len: usize) -> Self {
        BufferView {
            device,
            ptr,
            len,
            host: false,
            exclusive: false,
            read_only: false,
            _t: PhantomData,
        }
    }

    /// This view as a mutable one (the caller holds the exclusive borrow `'a` stands for).
    pub(crate) fn into_mut(mut self) -> BufferViewMut<'a, T> {
        self.exclusive = true;
        BufferViewMut {
            view: self,
            _m: PhantomData,
        }
    }

    /// Whether device work may write it: any view, except a shared one of memory the host
    /// reads directly ([`HostBuffer`]).
    pub(crate) fn check_device_write(&self, what: &str) -> Result<()> {
        if self.read_only {
            return Err(Error::InvalidArgument(format!(
                "{what} into {self:?}: it is a program's global, which the safe API only reads \
                 (it may be read-only data of the image)"
            )));
        }
        if self.host && !self.exclusive {
            return Err(Error::InvalidArgument(format!(
                "{what} into {self:?}: it is memory the host reads directly (a HostBuffer), \
                 which device work writes only through an exclusive borrow (view_mut, \
                 slice_mut, &mut)"
            )));
        }
        Ok(())
    }

    /// The same view marked as coming from an exclusive borrow (for `&mut` kernel arguments,
    /// whose exclusive borrow the caller holds).
    pub(crate) fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Whether device work must not write it: a shared view of host-visible memory (a host
    /// reference may exist) or a global.
    pub(crate) fn device_writes_refused(&self) -> bool {
        self.read_only || (self.host && !self.exclusive)
    }

    /// The same view, marked as one nothing may write through.
    pub(crate) fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The device address of its first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    pub(crate) fn device_identity(&self) -> usize {
        Arc::as_ptr(self.device) as *const () as usize
    }

    fn split(&self, mid: usize) -> Result<(BufferView<'a, T>, BufferView<'a, T>)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    pub(crate) fn device(&self) -> &'a Arc<dyn GenericDevice> {
        self.device
    }

    /// The elements in `range` of this view (an error if the range is not inside it).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'a, T>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(self.len),
        };
        match (start, end) {
            (Some(s), Some(e)) if s <= e && e <= self.len => Ok(BufferView {
                device: self.device,
                ptr: DevicePtr(self.ptr.0 + (s * std::mem::size_of::<T>()) as u64),
                len: e - s,
                host: self.host,
                exclusive: self.exclusive,
                read_only: self.read_only,
                _t: PhantomData,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "the range {:?}..{:?} is not inside {self:?} (elements 0..{})",
                range.start_bound(),
                range.end_bound(),
                self.len
            ))),
        }
    }

    pub(crate) fn check_len(&self, len: usize, what: &str) -> Result<()> {
        // Rust's rule for copies between slices (`copy_from_slice`): the lengths are equal. A
        // part of the buffer is copied through a view of that part (`slice(..n)`).
        if len != self.len {
            return Err(Error::InvalidArgument(format!(
                "{what} of {len} elements ({} bytes) against a buffer or view of {} elements of \
                 {} ({} bytes) at {}: the lengths must be equal (as for copy_from_slice); copy a \
                 part through a view of that part (slice(..n))",
                len * std::mem::size_of::<T>(),
                self.len,
                std::any::type_name::<T>(),
                self.size(),
                self.ptr
            )));
        }
        Ok(())
    }

    /// Copies `data` into the view (an error unless their lengths are equal).
    pub fn write(&self, data: &[T]) -> Result<()> {
        self.check_device_write("write")?;
        self.check_len(data.len(), "write")?;
        let bytes = bytes_of(data);
        let _span = tracing::info_span!(target: "offload::copy", "copy to device",
            bytes = bytes.len(), to = %self.ptr, "{} bytes host -> device {}", bytes.len(), self.ptr)
        .entered();
        // SAFETY: the view's range of its live buffer; host memory only through an exclusive
        // borrow (`check_device_write`), and device memory has no host reference to race with.
        unsafe { self.device.write(self.ptr, bytes) }
    }

    /// Copies the view into `out` (an error unless their lengths are equal).
    pub fn read(&self, out: &mut [T]) -> Result<()> {
        self.check_len(out.len(), "read")?;
        let bytes = bytes_of_mut(out);
        let _span = tracing::info_span!(target: "offload::copy", "copy to host",
            bytes = bytes.len(), from = %self.ptr, "{} bytes device {} -> host", bytes.len(), self.ptr)
        .entered();
        // SAFETY: the view's range of its live buffer; the layer orders the read after queued
        // work that writes it.
        unsafe { self.device.read(bytes, self.ptr) }
    }

    /// The view's elements, on the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        out.try_reserve_exact(self.len).map_err(|_| {
            Error::OutOfMemory(format!("{} host bytes for a copy of {self:?}", self.size()))
        })?;
        // SAFETY: `T` is plain data (`DeviceCopy`): all-zero bytes are a valid value. (Zeroed
        // rather than left uninitialised: a reference to uninitialised values is not allowed
        // even for plain data.)
        out.resize(self.len, unsafe { std::mem::zeroed::<T>() });
        self.read(&mut out)?;
        Ok(out)
    }

    /// Sets every element of the view to `value`.
    pub fn fill(&self, value: T) -> Result<()> {
        self.check_device_write("fill")?;
        // In chunks of at most 1 MiB of host memory.
        let per = (1usize << 20) / std::mem::size_of::<T>().max(1);
        let chunk = vec![value; per.clamp(1, self.len.max(1))];
        let mut done = 0;
        while done < self.len {
            let n = chunk.len().min(self.len - done);
            let at = DevicePtr(self.ptr.0 + (done * std::mem::size_of::<T>()) as u64);
            // SAFETY: inside the view's range, which may be written (as in `write`).
            unsafe { self.device.write(at, bytes_of(&chunk[..n])) }?;
            done += n;
        }
        Ok(())
    }

    /// Copies all of `src` (a buffer or view of the same device, of this view's length) into this view,
    /// on the device. Overlapping ranges (two views of one buffer) copy as `memmove` does on the
    /// host backend; GPU backends do not promise that yet (issue 20), so avoid overlapping
    /// device copies there.
    pub fn copy_from<'s>(&self, src: impl Into<BufferView<'s, T>>) -> Result<()> {
        let src = src.into();
        self.check_device_write("copy")?;
        self.check_len(src.len, "copy")?;
        if !Arc::ptr_eq(self.device, src.device) {
            return Err(Error::InvalidArgument(format!(
                "copy from {src:?} to {self:?}: they are on different devices (copy through \
                 the host with to_vec and write)"
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let _span = tracing::info_span!(target: "offload::copy", "copy device to device",
            bytes = src.size(), "{} bytes device {} -> device {}", src.size(), src.ptr, self.ptr)
        .entered();
        // SAFETY: both ranges are views of live buffers of this device, of one length; the
        // destination may be written (as in `write`).
        unsafe {
            self.device
                .copy_device_to_device(self.ptr, src.ptr, src.size(), None)
        }
    }
}

/// A range of a [`DeviceBuffer`] borrowed exclusively ([`DeviceBuffer::slice_mut`]): a kernel
/// argument the kernel may write, and an end of copies.
pub struct BufferViewMut<'a, T: DeviceCopy> {
    view: BufferView<'a, T>,
    _m: PhantomData<&'a mut [T]>,
}

impl<T: DeviceCopy> std::fmt::Debug for BufferViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} (mutable)", self.view)
    }
}

impl<'a, T: DeviceCopy> BufferViewMut<'a, T> {
    /// The view itself, still marked exclusive (for kernel arguments the kernel writes).
    pub(crate) fn exclusive_view(&self) -> BufferView<'_, T> {
        self.view
    }

    /// A shared view of the same range, for as long as this one is borrowed.
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            exclusive: false,
            ..self.view
        }
    }

    /// The device address of its first element.
    pub fn ptr(&self) -> DevicePtr {
        self.view.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.view.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// A mutable view of the elements in `range` of this one.
    pub fn slice_mut(self, range: impl RangeBounds<usize>) -> Result<BufferViewMut<'a, T>> {
        Ok(self.view.slice(range)?.into_mut())
    }

    /// [`BufferView::write`] on this range.
    pub fn write(&self, data: &[T]) -> Result<()> {
        self.view.write(data)
    }

    /// [`BufferView::read`] on this range.
    pub fn read(&self, out: &mut [T]) -> Result<()> {
        self.view.read(out)
    }

    /// [`BufferView::to_vec`] on this range.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.view.to_vec()
    }

    /// [`BufferView::fill`] on this range.
    pub fn fill(&self, value: T) -> Result<()> {
        self.view.fill(value)
    }

    /// [`BufferView::copy_from`] into this range.
    pub fn copy_from<'s>(&self, src: impl Into<BufferView<'s, T>>) -> Result<()> {
        self.view.copy_from(src)
    }
}

/// Memory of a device that the host reads and writes directly, as a slice: host memory the
/// device reaches ([`crate::Device::alloc_host`]: pinned on CUDA) or memory both share
/// ([`crate::Device::alloc_shared`]: managed). On the host backend it is the same memory as
/// any buffer: zero-copy. Device work writes it only through an exclusive borrow (`&mut`,
/// [`HostBuffer::view_mut`]), and [`HostBuffer::as_slice`] first waits for queued work that
/// uses it, so a slice never sees the memory change under it.
pub struct HostBuffer<T: DeviceCopy> {
    buf: DeviceBuffer<T>,
    kind: crate::MemoryKind,
}

impl<T: DeviceCopy> std::fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostBuffer<{}>({:?}, {}, {} elements)",
            std::any::type_name::<T>(),
            self.kind,
            self.buf.ptr,
            self.buf.len
        )
    }
}

impl<T: DeviceCopy> HostBuffer<T> {
    /// Takes a fresh allocation of `kind` after checking that this process can address all
    /// of it and that what the device writes there is what the host reads: a plugin whose
    /// host memory is not host memory is refused here, before any slice exists.
    pub(crate) fn new(buf: DeviceBuffer<T>, kind: crate::MemoryKind, device: &str) -> Result<Self> {
        let size = buf.size() as usize;
        let refuse = |why: String| {
            Err(Error::Unsupported(format!(
                "{kind:?} memory of {device} is not memory this process can read: {why}"
            )))
        };
        if buf.ptr.0 % std::mem::align_of::<T>().max(1) as u64 != 0 {
            return refuse(format!(
                "{} is not aligned for {}",
                buf.ptr,
                std::any::type_name::<T>()
            ));
        }
        // Reads through the host address with the kernel's checked copy: no fault if the
        // address is not mapped, an error instead.
        let host_read = |at: u64, out: &mut [u8]| -> std::io::Result<()> {
            let local = libc::iovec {
                iov_base: out.as_mut_ptr().cast(),
                iov_len: out.len(),
            };
            let remote = libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: out.len(),
            };
            // SAFETY: process_vm_readv on this process copies `out.len()` bytes from the
            // remote address into `out` (valid for that many bytes); an unmapped remote range
            // is EFAULT, not a fault.
            let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if n as usize != out.len() {
                return Err(std::io::Error::other(format!("{n} of {} bytes", out.len())));
            }
            Ok(())
        };
        // All of it is addressable (1 MiB at a time)...
        let mut chunk = vec![0u8; size.min(1 << 20)];
        let mut done = 0;
        while done < size {
            let n = chunk.len().min(size - done);
            if let Err(e) = host_read(buf.ptr.0 + done as u64, &mut chunk[..n]) {
                return refuse(format!(
                    "reading byte {done} of {size} at {} failed ({e})",
                    buf.ptr
                ));
            }
            done += n;
        }
        // ... and what the device writes at either end is what the host reads there.
        let edge = size.min(4096);
        for at in [0, size - edge] {
            let pattern: Vec<u8> = (0..edge)
                .map(|i| ((at + i) as u8).wrapping_mul(31).wrapping_add(7))
                .collect();
            let dst = DevicePtr(buf.ptr.0 + at as u64);
            // SAFETY: inside the allocation just made, which nothing else holds yet.
            unsafe { buf.device.write(dst, &pattern) }?;
            let mut seen = vec![0u8; edge];
            if let Err(e) = host_read(dst.0, &mut seen) {
                return refuse(format!("reading {dst} failed ({e})"));
            }
            if seen != pattern {
                return refuse(format!(
                    "the host sees other bytes at {dst} than the device wrote"
                ));
            }
        }
        Ok(HostBuffer { buf, kind })
    }

    /// Which kind of memory it is.
    pub fn kind(&self) -> crate::MemoryKind {
        self.kind
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.buf.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.buf.len == 0
    }

    /// Its device address.
    pub fn ptr(&self) -> DevicePtr {
        self.buf.ptr
    }

    /// Waits for queued work that uses this memory (a one-element synchronous read: the layer
    /// makes every synchronous operation wait for queued work on the same memory).
    fn settle(&self) -> Result<()> {
        let mut one = vec![0u8; std::mem::size_of::<T>().max(1)];
        // SAFETY: the first element of the live buffer.
        unsafe { self.buf.device.read(&mut one, self.buf.ptr) }
    }

    /// The elements, read in place; an error if queued work on it failed to finish.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.settle()?;
        // SAFETY: `HostBuffer::new` checked that this process addresses all `len` elements
        // (aligned for T); queued work that uses the memory has finished (settle), and device
        // work writes it only through `&mut self` (view_mut, `&mut` kernel arguments; shared
        // views refuse device writes), which this shared borrow excludes while the slice
        // lives. `T` is plain data: any bytes are a valid value.
        Ok(unsafe { std::slice::from_raw_parts(self.buf.ptr.0 as *const T, self.buf.len) })
    }

    /// The elements, written in place.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.settle()?;
        // SAFETY: as for `as_slice`, with the exclusive borrow: no view of the buffer exists
        // and no queued work uses it any more.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.0 as *mut T, self.buf.len) })
    }

    /// A shared view: an end of copies from it, and a kernel argument the kernel only reads.
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            host: true,
            ..self.buf.view()
        }
    }

    /// An exclusive view: device work may write it.
    pub fn view_mut(&mut self) -> BufferViewMut<'_, T> {
        BufferView {
            host: true,
            ..self.buf.view()
        }
        .into_mut()
    }
}

impl<'a, T: DeviceCopy> From<&'a HostBuffer<T>> for BufferView<'a, T> {
    fn from(b: &'a HostBuffer<T>) -> Self {
        b.view()
    }
}

impl<'a, T: DeviceCopy> From<&'a mut HostBuffer<T>> for BufferView<'a, T> {
    fn from(b: &'a mut HostBuffer<T>) -> Self {
        b.view_mut().into()
    }
}
