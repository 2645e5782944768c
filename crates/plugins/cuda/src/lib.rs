//! The NVIDIA GPUs backend as a plugin library: the ABI entry symbol over
//! [`offload_cuda::CudaBackend`]. Only this package defines the entry, so the backend's rlib can
//! be linked into tests and programs next to other backends.

offload_plugin_common::export_backend!(unsafe offload_cuda::CudaBackend::new);
