// Overlapping mutable views of one buffer in one launch (disjoint ones come from split_at_mut).
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = unsafe { device.load_trusted(b"image") }?;
    let mut y = device.alloc::<f32>(16)?;
    program
        .kernel("add")?
        .launch(offload::LaunchDims::linear(1, 16))
        .arg(8i32)
        .arg(y.slice_mut(0..8)?)
        .arg(y.slice_mut(4..12)?)
        .run()
}
