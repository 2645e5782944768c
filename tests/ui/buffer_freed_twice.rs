// A buffer freed twice through the safe API: its drop takes it, so there is no second one.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let x = device.alloc::<f32>(16)?;
    drop(x);
    drop(x);
    Ok(())
}
