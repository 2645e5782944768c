//! The remote-device backend as a plugin library: the ABI entry symbol over
//! [`offload_mpi_plugin::MpiPlugin`]. It implements the plugin traits itself (not through the
//! generic device layer): every check the layer makes is made by the layer of the proxy's
//! node, on the device that does the work.

offload_abi::export_plugin!(unsafe offload_mpi_plugin::MpiPlugin::new);
