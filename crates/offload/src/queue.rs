//! Queues and events of the safe API: owned handles of the device API's queues and events,
//! destroyed when dropped.
//!
//! Ordering rules: work enqueued on one queue runs in order, asynchronously to the caller.
//! Across queues, only events order work ([`Queue::record`], [`Queue::wait`]). A synchronous
//! operation on a buffer (a read, a write, a synchronous launch) first waits for the queued work
//! that uses that buffer, on any queue, so it never sees memory from before that work, nor
//! changes it under that work. Buffers a queued operation uses stay alive until it has run,
//! even if they are dropped first. Host memory given to a queued copy is owned by the queue
//! until [`Queue::synchronize`] (or the queue's drop) has seen the copy run.

use crate::{Device, DeviceBuffer, DeviceCopy};
use offload_core::sync::lock;
use offload_core::{EventHandle, QueueHandle, Result};
use std::any::Any;
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
        let handle = device.raw().queue_create()?;
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
        let r = self.device.raw().queue_synchronize(self.handle);
        // Whatever the outcome, every job submitted before the wait has run or been skipped.
        lock(&self.owned).drain(..before);
        r
    }

    /// Enqueues a copy of `data` to the start of `buf` (an error if it does not fit). The
    /// queue owns `data` until it has been synchronised.
    pub fn upload<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, data: Vec<T>) -> Result<()> {
        self.check_device(buf.device_identity(), "upload")?;
        buf.check_len(data.len(), "queued upload")?;
        let bytes = std::mem::size_of_val(data.as_slice());
        // SAFETY: `data` is moved into `owned` below, before the copy can run, and stays there
        // until a synchronisation has seen the copy run (a Vec's heap block does not move when
        // the Vec does).
        unsafe {
            self.device.raw().copy_to_device(
                buf.ptr(),
                data.as_ptr().cast::<u8>(),
                bytes,
                Some(self.handle),
            )
        }?;
        lock(&self.owned).push(Box::new(data));
        Ok(())
    }

    /// Enqueues a device-to-device copy of all of `src` to the start of `dst`.
    pub fn copy<T: DeviceCopy>(&self, dst: &DeviceBuffer<T>, src: &DeviceBuffer<T>) -> Result<()> {
        self.check_device(dst.device_identity(), "copy")?;
        self.check_device(src.device_identity(), "copy")?;
        dst.check_len(src.len(), "queued copy")?;
        self.device
            .raw()
            .copy_device_to_device(dst.ptr(), src.ptr(), src.size(), Some(self.handle))
    }

    /// An event recorded now on this queue: it completes when the work enqueued before it has.
    pub fn record(&self) -> Result<Event> {
        let raw = self.device.raw();
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
        self.device.raw().event_wait(event.handle, self.handle)
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
        // Destroying waits for the queue to drain, so the host memory it owns outlives the work.
        let _ = self.device.raw().queue_destroy(self.handle);
        lock(&self.owned).clear();
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
        self.device.raw().event_synchronize(self.handle)
    }

    /// Whether it has completed.
    pub fn is_complete(&self) -> Result<bool> {
        self.device.raw().event_query(self.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.device.raw().event_destroy(self.handle);
    }
}
