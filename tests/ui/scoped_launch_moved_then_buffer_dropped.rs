// A launch put on a scope, moved to another variable, then given a buffer that is dropped
// inside the scope: the scope's rule (buffers borrowed until it ends) follows the launch.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = unsafe { device.load_trusted(b"image") }?;
    let kernel = program.kernel("scale")?;
    let queue = device.queue()?;
    queue.scope(|s| {
        let mut launch = kernel.launch(offload::LaunchDims::linear(1, 16));
        launch.on(s);
        let mut moved = launch;
        let mut x = device.alloc::<f32>(16)?;
        moved.arg(16i32).arg(0.5f32).arg(&mut x).run()?;
        drop(x);
        Ok(())
    })
}
