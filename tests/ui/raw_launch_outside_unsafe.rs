// The raw device's launch from safe code: it takes whatever pointers it is given, so it is an
// `unsafe fn` (a pointer past an allocation would be a heap overflow on the host backend).
use offload::{DevicePtr, KernelArg, KernelHandle, LaunchDims};
use offload_core::traits::GenericDevice;

fn launch_from_safe_code(device: &dyn GenericDevice, kernel: KernelHandle) {
    let past_the_end = [KernelArg::Ptr(DevicePtr(0x1000))];
    let _ = device.launch(kernel, &LaunchDims::linear(1, 1), &past_the_end, None);
}

fn main() {
    let _ = launch_from_safe_code;
}
