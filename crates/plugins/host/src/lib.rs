//! The host backend as a plugin library: the ABI entry symbol over
//! [`offload_host::HostBackend`]. The backend itself is an rlib (`plugin-host-elf`), which the
//! runtime can also link into a program (the `offload` crate's `host` feature); only this
//! package defines the entry, so the two never collide.

offload_plugin_common::export_backend!(unsafe offload_host::HostBackend::new);
