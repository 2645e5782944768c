// The raw device's free from safe code: the safe API's buffer still holds the address (and
// frees it again when dropped), so it is an `unsafe fn`, as is reaching the raw device.
use offload_core::traits::GenericDevice;

fn free_from_safe_code(device: &dyn GenericDevice, buffer: &offload::DeviceBuffer<f32>) {
    let _ = device.free(buffer.ptr());
}

fn raw_device_from_safe_code(device: &offload::Device) {
    let _ = offload::raw::device(device);
}

fn main() {
    let _ = (free_from_safe_code, raw_device_from_safe_code);
}
