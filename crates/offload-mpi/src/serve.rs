//! The proxy's side: a node's devices behind the messages of [`crate::wire`].
//!
//! Device memory is held as the safe API's [`offload::DeviceBuffer`]s, named to the client by
//! opaque handles: an unknown handle, a range outside its allocation or a corrupted message is
//! a [`Reply::Failed`], never a crash.

use crate::wire::{RemoteDevice, Reply, Request, VERSION};
use offload::{Device, DeviceBuffer};
use offload_core::{Error, Result};
use std::collections::HashMap;

/// What a proxy serves: its node's devices and the allocations made on them.
#[derive(Debug)]
pub struct Server {
    devices: Vec<Device>,
    allocations: HashMap<u64, DeviceBuffer<u8>>,
    next: u64,
}

/// What one message came to: the reply, and whether the proxy ends after sending it.
#[derive(Debug)]
pub struct Answer {
    /// The reply's bytes.
    pub reply: Vec<u8>,
    /// A [`Request::Shutdown`] was served.
    pub shutdown: bool,
}

impl Server {
    /// Serves `devices` (in this order: their indices in the hello).
    pub fn new(devices: Vec<Device>) -> Server {
        Server {
            devices,
            allocations: HashMap::new(),
            next: 1,
        }
    }

    /// The hello: this side's version and devices.
    pub fn hello(&self) -> Result<Reply> {
        let devices = self
            .devices
            .iter()
            .map(|d| {
                let info = d.info()?;
                Ok(RemoteDevice {
                    plugin: d.plugin_name().to_string(),
                    index: d.index() as u32,
                    name: info.name,
                    compute_unit_kind: info.compute_unit_kind,
                    total_memory: info.total_memory,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Reply::Hello {
            version: VERSION,
            devices,
        })
    }

    /// Answers one message. A message that does not decode is answered with the error (id 0:
    /// its own id cannot be trusted).
    pub fn answer(&mut self, message: &[u8]) -> Answer {
        let (id, request) = match Request::decode(message) {
            Ok(r) => r,
            Err(e) => {
                return Answer {
                    reply: Reply::failed(&e).encode(0),
                    shutdown: false,
                };
            }
        };
        let shutdown = request == Request::Shutdown;
        let reply = self.serve(request).unwrap_or_else(|e| Reply::failed(&e));
        Answer {
            reply: reply.encode(id),
            shutdown,
        }
    }

    fn buffer(&self, handle: u64) -> Result<&DeviceBuffer<u8>> {
        self.allocations.get(&handle).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "handle {handle:#x} is no allocation of this proxy (freed, or never made)"
            ))
        })
    }

    /// The range `offset..offset + len` of an allocation of `size` bytes, or an error naming it.
    fn range(handle: u64, size: usize, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= size as u64 => Ok(offset as usize..end as usize),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..{offset}+{len} are outside allocation {handle:#x} ({size} bytes)"
            ))),
        }
    }

    fn serve(&mut self, request: Request) -> Result<Reply> {
        Ok(match request {
            Request::Hello => self.hello()?,
            Request::Alloc { device, bytes } => {
                let d = self.devices.get(device as usize).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "device {device}: this proxy has {} device(s)",
                        self.devices.len()
                    ))
                })?;
                let len = usize::try_from(bytes).map_err(|_| {
                    Error::OutOfMemory(format!("{bytes} bytes cannot be allocated on this node"))
                })?;
                let buffer = d.alloc::<u8>(len)?;
                let handle = self.next;
                self.next += 1;
                self.allocations.insert(handle, buffer);
                Reply::Handle { handle }
            }
            Request::Free { handle } => {
                self.allocations.remove(&handle).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "handle {handle:#x} is no allocation of this proxy (freed, or never made)"
                    ))
                })?;
                Reply::Done
            }
            Request::Write {
                handle,
                offset,
                bytes,
            } => {
                let b = self.buffer(handle)?;
                let r = Self::range(handle, b.len(), offset, bytes.len() as u64)?;
                if !r.is_empty() {
                    b.slice(r)?.write(&bytes)?;
                }
                Reply::Done
            }
            Request::Read {
                handle,
                offset,
                len,
            } => {
                let b = self.buffer(handle)?;
                let r = Self::range(handle, b.len(), offset, len)?;
                let bytes = if r.is_empty() {
                    Vec::new()
                } else {
                    b.slice(r)?.to_vec()?
                };
                Reply::Bytes { bytes }
            }
            Request::Shutdown => Reply::Done,
        })
    }
}
