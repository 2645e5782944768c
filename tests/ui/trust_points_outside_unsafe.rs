// What trusts code it cannot check, called from safe code: loading an image (its initialisers
// run, its parameter records are believed), opening a plugin library, wrapping a plugin or a
// backend whose devices are raw, a launch with arguments as they are.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = device.load_trusted(b"image")?;
    let kernel = program.kernel("fill")?;
    let past_the_end = [offload::KernelArg::Ptr(offload::DevicePtr(0x1000))];
    kernel.launch(offload::LaunchDims::linear(1, 1)).args_raw(&past_the_end).unchecked().run()?;
    let plugin = offload_abi::loader::LoadedPlugin::open(std::path::Path::new("libplugin.so"))?;
    let _ = plugin;
    let host = offload_host::HostBackend::new();
    let _ = host;
    Ok(())
}

fn wrap(backend: offload_host::HostBackend) {
    let _ = offload_plugin_common::Plugin::new(backend);
    let _ = wrap;
}
