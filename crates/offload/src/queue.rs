//! Queues and events of the safe API: owned handles of the device API's queues and events,
//! destroyed when dropped.
//!
//! Ordering rules: work enqueued on one queue runs in order, asynchronously to the caller.
//! Across queues, only events order work ([`Queue::record`], [`Queue::wait`]). A synchronous
//! operation on a buffer (a read, a write, a synchronous launch) first waits for the queued work
//! that uses that buffer, on any queue, so it never sees memory from before that work, nor
//! changes it under that work. Buffers a queued operation uses stay alive until it has run,
//! even if they are dropped first. Host memory given to a queued copy is either owned by the
//! queue until [`Queue::synchronize`] (or the queue's drop) has seen the copy run
//! ([`Queue::upload`]), or borrowed for a [`Queue::scope`], which synchronises the queue before
//! it returns, so the borrow checker keeps the memory alive and unchanged while the queue may
//! use it.

use crate::buffer::{BufferView, bytes_of};
use crate::{Device, DeviceCopy};
use offload_core::sync::lock;
use offload_core::{EventHandle, QueueHandle, Result};
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Mutex;

/// An in-order queue of a device ([`Device::queue`]). Dropping it waits for its work.
pub struct Queue {
    device: Device,
    handle: QueueHandle,
    /// Host memory of queued copies, kept until the queue has been synchronised.
    owned: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({:#x} of {})", self.handle.0, self.device)
    }
}

impl Queue {
    pub(crate) fn new(device: Device) -> Result<Queue> {
        let handle = device.inner().queue_create()?;
        Ok(Queue {
            device,
            handle,
            owned: Mutex::default(),
        })
    }

    /// The device's handle of the queue (for [`offload_core::GenericDevice`] calls).
    pub fn handle(&self) -> QueueHandle {
        self.handle
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn device_identity(&self) -> usize {
        self.device.identity()
    }

    /// Waits until everything enqueued so far has run; the first error of that work (the
    /// queue then refuses work until it is dropped). Host memory of finished copies is freed.
    pub fn synchronize(&self) -> Result<()> {
        // Only what was queued before the wait may go: another thread may queue (and push)
        // more while this one waits.
        let before = lock(&self.owned).len();
        let r = self.device.inner().queue_synchronize(self.handle);
        let done: Vec<_> = lock(&self.owned).drain(..before).collect();
        match &r {
            // The work may still read it: never freed (the device is failed for good).
            Err(e) if e.is_unsettled() => std::mem::forget(done),
            // Every job submitted before the wait has run or been skipped.
            _ => drop(done),
        }
        r
    }

    /// Enqueues a copy of `data` into `buf` (a buffer or view; an error unless their lengths
    /// are equal). The queue owns `data` until it has been synchronised.
    pub fn upload<'b, T: DeviceCopy>(
        &self,
        buf: impl Into<BufferView<'b, T>>,
        data: Vec<T>,
    ) -> Result<()> {
        let buf = buf.into();
        buf.check_device_write("queued upload")?;
        self.check_device(buf.device_identity(), "upload")?;
        buf.check_len(data.len(), "queued upload")?;
        let bytes = std::mem::size_of_val(data.as_slice());
        // SAFETY: `data` is moved into `owned` below, before the copy can run, and stays there
        // until a synchronisation has seen the copy run (a Vec's heap block does not move when
        // the Vec does).
        unsafe {
            self.device.inner().copy_to_device(
                buf.ptr(),
                data.as_ptr().cast::<u8>(),
                bytes,
                Some(self.handle),
            )
        }?;
        lock(&self.owned).push(Box::new(data));
        Ok(())
    }

    /// Enqueues a device-to-device copy of `src` into `dst` (buffers or views of equal
    /// lengths).
    pub fn copy<'d, 's, T: DeviceCopy>(
        &self,
        dst: impl Into<BufferView<'d, T>>,
        src: impl Into<BufferView<'s, T>>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        dst.check_device_write("queued copy")?;
        self.check_device(dst.device_identity(), "copy")?;
        self.check_device(src.device_identity(), "copy")?;
        dst.check_len(src.len(), "queued copy")?;
        // SAFETY: both ranges are views of live buffers of the queue's device, of one length,
        // and the destination may be written by device work (`check_device_write`); the views'
        // borrows last as long as the queue's scope, so neither buffer goes before the copy has
        // run.
        unsafe {
            self.device.inner().copy_device_to_device(
                dst.ptr(),
                src.ptr(),
                src.size(),
                Some(self.handle),
            )
        }
    }

    /// An event recorded now on this queue: it completes when the work enqueued before it has.
    pub fn record(&self) -> Result<Event> {
        let raw = self.device.inner();
        let handle = raw.event_create()?;
        let event = Event {
            device: self.device.clone(),
            handle,
        };
        raw.event_record(handle, self.handle)?;
        Ok(event)
    }

    /// Makes this queue's later work wait until `event` completes.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.check_device(event.device.identity(), "wait")?;
        self.device.inner().event_wait(event.handle, self.handle)
    }

    /// Runs `f` with a scope in which queued copies may borrow host memory, and launches
    /// ([`crate::Launch::on`] the scope) keep their buffers borrowed: the queue is synchronised
    /// before `scope` returns (also when `f` fails or panics), so nothing borrowed for the
    /// scope can be dropped, moved or changed while the queue may still use it. The result is
    /// `f`'s, or the queue's first error.
    pub fn scope<'env, F, R>(&'env self, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope QueueScope<'scope, 'env>) -> Result<R>,
    {
        struct SyncOnExit<'q>(&'q Queue, bool);
        impl Drop for SyncOnExit<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    // Unwinding or after an early return: the work must still finish before
                    // the borrowed memory is released.
                    let _ = self.0.synchronize();
                }
            }
        }
        let mut guard = SyncOnExit(self, false);
        let scope = QueueScope {
            queue: self,
            _scope: PhantomData,
            _env: PhantomData,
        };
        let r = f(&scope);
        guard.1 = true;
        let synced = self.synchronize();
        let r = r?;
        synced?;
        Ok(r)
    }

    fn check_device(&self, identity: usize, what: &str) -> Result<()> {
        if identity != self.device.identity() {
            return Err(offload_core::Error::InvalidArgument(format!(
                "{what} on {self:?}: the other side belongs to another device"
            )));
        }
        Ok(())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Destroying waits for the queue to drain, so the host memory it owns outlives the work;
        // unless that work did not settle, when it is never freed.
        let destroyed = self.device.inner().queue_destroy(self.handle);
        let owned = std::mem::take(&mut *lock(&self.owned));
        if destroyed
            .as_ref()
            .is_err_and(offload_core::Error::is_unsettled)
        {
            std::mem::forget(owned);
        }
    }
}

/// A point in a queue's work ([`Queue::record`]), destroyed when dropped.
pub struct Event {
    device: Device,
    handle: EventHandle,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:#x} of {})", self.handle.0, self.device)
    }
}

impl Event {
    /// Waits on the calling thread until it completes; the error of the work it followed.
    pub fn synchronize(&self) -> Result<()> {
        self.device.inner().event_synchronize(self.handle)
    }

    /// Whether it has completed.
    pub fn is_complete(&self) -> Result<bool> {
        self.device.inner().event_query(self.handle)
    }

    /// The time from `earlier`'s completion to this event's (both recorded on queues of the
    /// same device and completed: synchronize this one first). The layer takes each event's
    /// time on the host clock when the work before it has run, so it includes the layer's
    /// own cost of running that work; an error for events of different devices, events not
    /// completed, or a start that completed after the end.
    pub fn elapsed_since(&self, earlier: &Event) -> Result<std::time::Duration> {
        if earlier.device.identity() != self.device.identity() {
            return Err(offload_core::Error::InvalidArgument(format!(
                "event timing: {earlier:?} and {self:?} belong to different devices"
            )));
        }
        self.device
            .inner()
            .event_elapsed(earlier.handle, self.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.device.inner().event_destroy(self.handle);
    }
}

/// A [`Queue::scope`]: queued operations that borrow host memory and buffers until the scope's
/// end. `'scope` is the scope's own lifetime, `'env` that of what it borrows from outside.
pub struct QueueScope<'scope, 'env: 'scope> {
    queue: &'env Queue,
    // Invariant in both, as `std::thread::Scope` is: a borrow for 'scope cannot be shortened.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for QueueScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "scope of {:?}", self.queue)
    }
}

impl<'scope> QueueScope<'scope, '_> {
    /// The queue.
    pub fn queue(&self) -> &Queue {
        self.queue
    }

    /// Enqueues a copy of `src` into `dst` (a buffer or view; an error unless their lengths
    /// are equal); `src` stays borrowed until the scope's end.
    pub fn write<T: DeviceCopy>(
        &'scope self,
        dst: impl Into<BufferView<'scope, T>>,
        src: &'scope [T],
    ) -> Result<()> {
        let dst = dst.into();
        dst.check_device_write("queued write")?;
        self.queue.check_device(dst.device_identity(), "write")?;
        dst.check_len(src.len(), "queued write")?;
        let bytes = bytes_of(src);
        // SAFETY: `src` is borrowed for 'scope, and the scope synchronises the queue before it
        // ends, so the memory is live and unchanged until the copy has run.
        unsafe {
            dst.device().copy_to_device(
                dst.ptr(),
                bytes.as_ptr(),
                bytes.len(),
                Some(self.queue.handle),
            )
        }
    }

    /// Enqueues a copy of `src` (a buffer or view) into `dst`, which stays borrowed until the
    /// scope's end (an error unless their lengths are equal).
    pub fn read<T: DeviceCopy>(
        &'scope self,
        dst: &'scope mut [T],
        src: impl Into<BufferView<'scope, T>>,
    ) -> Result<()> {
        let src = src.into();
        self.queue.check_device(src.device_identity(), "read")?;
        src.check_len(dst.len(), "queued read")?;
        let bytes = std::mem::size_of_val(dst);
        // SAFETY: `dst` is borrowed exclusively for 'scope, which synchronises the queue before
        // it ends; `T` is plain data, so any bytes the copy writes make valid values.
        unsafe {
            src.device().copy_from_device(
                dst.as_mut_ptr().cast::<u8>(),
                src.ptr(),
                bytes,
                Some(self.queue.handle),
            )
        }
    }

    /// Enqueues a device-to-device copy of `src` into `dst` (of equal lengths).
    pub fn copy<T: DeviceCopy>(
        &'scope self,
        dst: impl Into<BufferView<'scope, T>>,
        src: impl Into<BufferView<'scope, T>>,
    ) -> Result<()> {
        self.queue.copy(dst, src)
    }

    /// [`Queue::record`].
    pub fn record(&self) -> Result<Event> {
        self.queue.record()
    }

    /// [`Queue::wait`].
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.queue.wait(event)
    }
}
