//! The one error vocabulary shared by the core, every plugin and the runtime.
//!
//! Errors cross the C plugin ABI as `(kind, native code, message)`, so every variant maps to an
//! [`ErrorKind`] and back without losing the text. Variants fall in two groups, and the docs of
//! each say which: *caller bugs* (an invalid argument, an unknown kernel name, an image for
//! another device) and *runtime failures* (out of memory, a driver error, a compile failure).

use std::fmt;

/// Result type used across the offload crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the offload runtime or a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Caller bug or bad input: the image bytes are not a valid image for this backend. The
    /// message names the image and the byte or field at fault.
    #[error("invalid image: {0}")]
    InvalidImage(String),
    /// The request is valid in general but this plugin/device cannot serve it (another ELF
    /// machine, a feature the backend lacks).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Caller bug: a kernel, global, program, queue or device that does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Runtime failure: the device could not provide the memory asked for.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// Runtime failure: turning an image into device code failed (LLVM's or the assembler's
    /// diagnostic text is in the message).
    #[error("compile failure: {0}")]
    CompileFailure(String),
    /// Runtime failure reported by a device driver, with its native status code.
    #[error("driver error {code}: {message}")]
    Driver {
        /// The driver's own status code (e.g. a `CUresult` or `hipError_t`).
        code: i64,
        /// The driver's description plus what the plugin was doing.
        message: String,
    },
    /// A plugin library does not speak this runtime's plugin ABI.
    #[error("plugin ABI mismatch: {0}")]
    AbiMismatch(String),
    /// A plugin library could not be opened or has no entry symbol.
    #[error("plugin load failure: {0}")]
    PluginLoad(String),
    /// A plugin panicked inside an entry point; the panic was caught at the ABI boundary.
    #[error("plugin panicked: {0}")]
    PluginPanic(String),
    /// Caller bug: an argument is out of range or inconsistent (zero-sized launch, a pointer
    /// outside every allocation, a bad environment variable value, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No device (or no driver) is available for the request.
    #[error("no device: {0}")]
    NoDevice(String),
    /// Runtime failure while a kernel or copy was executing on the device.
    #[error("device failure: {0}")]
    DeviceFailure(String),
    /// An operating-system call failed (file, memory mapping, dynamic loader).
    #[error("system error: {0}")]
    System(String),
    /// Runtime failure of an operation that is not *settled*: it failed, and the device may
    /// still be reading or writing the memory it uses (a wait for a DMA copy or a stream that
    /// gave up before the work ended). The generic layer then never frees or reuses that
    /// memory, and the device takes no more work.
    #[error("unsettled device failure: {0}")]
    Unsettled(String),
}

/// The discriminant of [`Error`], as it crosses the plugin ABI (`repr(u32)`, values are part of
/// the ABI and never reused).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// [`Error::InvalidImage`]
    InvalidImage = 1,
    /// [`Error::Unsupported`]
    Unsupported = 2,
    /// [`Error::NotFound`]
    NotFound = 3,
    /// [`Error::OutOfMemory`]
    OutOfMemory = 4,
    /// [`Error::CompileFailure`]
    CompileFailure = 5,
    /// [`Error::Driver`]
    Driver = 6,
    /// [`Error::AbiMismatch`]
    AbiMismatch = 7,
    /// [`Error::PluginLoad`]
    PluginLoad = 8,
    /// [`Error::PluginPanic`]
    PluginPanic = 9,
    /// [`Error::InvalidArgument`]
    InvalidArgument = 10,
    /// [`Error::NoDevice`]
    NoDevice = 11,
    /// [`Error::DeviceFailure`]
    DeviceFailure = 12,
    /// [`Error::System`]
    System = 13,
    /// [`Error::Unsettled`]
    Unsettled = 14,
}

impl ErrorKind {
    /// Decodes a kind received over the ABI; unknown values (a newer plugin) become `None`.
    pub fn from_u32(value: u32) -> Option<Self> {
        use ErrorKind::*;
        Some(match value {
            1 => InvalidImage,
            2 => Unsupported,
            3 => NotFound,
            4 => OutOfMemory,
            5 => CompileFailure,
            6 => Driver,
            7 => AbiMismatch,
            8 => PluginLoad,
            9 => PluginPanic,
            10 => InvalidArgument,
            11 => NoDevice,
            12 => DeviceFailure,
            13 => System,
            14 => Unsettled,
            _ => return None,
        })
    }
}

impl Error {
    /// The ABI discriminant of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidImage(_) => ErrorKind::InvalidImage,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::OutOfMemory(_) => ErrorKind::OutOfMemory,
            Error::CompileFailure(_) => ErrorKind::CompileFailure,
            Error::Driver { .. } => ErrorKind::Driver,
            Error::AbiMismatch(_) => ErrorKind::AbiMismatch,
            Error::PluginLoad(_) => ErrorKind::PluginLoad,
            Error::PluginPanic(_) => ErrorKind::PluginPanic,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::NoDevice(_) => ErrorKind::NoDevice,
            Error::DeviceFailure(_) => ErrorKind::DeviceFailure,
            Error::System(_) => ErrorKind::System,
            Error::Unsettled(_) => ErrorKind::Unsettled,
        }
    }

    /// The native code carried by [`Error::Driver`], 0 otherwise.
    pub fn native_code(&self) -> i64 {
        match self {
            Error::Driver { code, .. } => *code,
            _ => 0,
        }
    }

    /// The message without the kind prefix that `Display` adds.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidImage(m)
            | Error::Unsupported(m)
            | Error::NotFound(m)
            | Error::OutOfMemory(m)
            | Error::CompileFailure(m)
            | Error::AbiMismatch(m)
            | Error::PluginLoad(m)
            | Error::PluginPanic(m)
            | Error::InvalidArgument(m)
            | Error::NoDevice(m)
            | Error::DeviceFailure(m)
            | Error::System(m)
            | Error::Unsettled(m) => m,
            Error::Driver { message, .. } => message,
        }
    }

    /// Rebuilds an error from its ABI parts. An unknown kind (from a newer plugin) is kept as a
    /// driver error so that no text is lost.
    pub fn from_parts(kind: u32, code: i64, message: String) -> Self {
        match ErrorKind::from_u32(kind) {
            Some(ErrorKind::InvalidImage) => Error::InvalidImage(message),
            Some(ErrorKind::Unsupported) => Error::Unsupported(message),
            Some(ErrorKind::NotFound) => Error::NotFound(message),
            Some(ErrorKind::OutOfMemory) => Error::OutOfMemory(message),
            Some(ErrorKind::CompileFailure) => Error::CompileFailure(message),
            Some(ErrorKind::Driver) => Error::Driver { code, message },
            Some(ErrorKind::AbiMismatch) => Error::AbiMismatch(message),
            Some(ErrorKind::PluginLoad) => Error::PluginLoad(message),
            Some(ErrorKind::PluginPanic) => Error::PluginPanic(message),
            Some(ErrorKind::InvalidArgument) => Error::InvalidArgument(message),
            Some(ErrorKind::NoDevice) => Error::NoDevice(message),
            Some(ErrorKind::DeviceFailure) => Error::DeviceFailure(message),
            Some(ErrorKind::System) => Error::System(message),
            Some(ErrorKind::Unsettled) => Error::Unsettled(message),
            None => Error::Driver {
                code,
                message: format!("(unknown error kind {kind}) {message}"),
            },
        }
    }

    /// This failure as one that is not settled (the device may still use the operation's
    /// memory), its text kept; an unsettled error stays as it is.
    pub fn unsettled(self) -> Self {
        match self {
            Error::Unsettled(_) => self,
            e => Error::Unsettled(format!(
                "{e}; the operation may still be using its memory on the device"
            )),
        }
    }

    /// The failure of a wait for a device's work: settled only if it is a
    /// [`Error::DeviceFailure`] (the driver reports the device's work lost, so nothing of it
    /// runs on), else [`Error::unsettled`] (nothing says the work ended).
    pub fn of_a_wait(self) -> Self {
        match self {
            Error::DeviceFailure(_) => self,
            e => e.unsettled(),
        }
    }

    /// Whether the failure is [`Error::Unsettled`].
    pub fn is_unsettled(&self) -> bool {
        matches!(self, Error::Unsettled(_))
    }

    /// Prefixes the message with context (which image, which plugin, which call), keeping the
    /// kind so callers can still match on it.
    pub fn context(self, what: impl fmt::Display) -> Self {
        let code = self.native_code();
        let kind = self.kind() as u32;
        let message = format!("{what}: {}", self.message());
        Error::from_parts(kind, code, message)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::System(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_abi_parts() {
        let all = [
            Error::InvalidImage("a".into()),
            Error::Unsupported("b".into()),
            Error::NotFound("c".into()),
            Error::OutOfMemory("d".into()),
            Error::CompileFailure("e".into()),
            Error::Driver {
                code: -7,
                message: "f".into(),
            },
            Error::AbiMismatch("g".into()),
            Error::PluginLoad("h".into()),
            Error::PluginPanic("i".into()),
            Error::InvalidArgument("j".into()),
            Error::NoDevice("k".into()),
            Error::DeviceFailure("l".into()),
            Error::System("m".into()),
            Error::Unsettled("n".into()),
        ];
        for e in all {
            let back = Error::from_parts(e.kind() as u32, e.native_code(), e.message().into());
            assert_eq!(back, e);
        }
    }

    #[test]
    fn unknown_kind_keeps_text_and_code() {
        let e = Error::from_parts(999, 42, "from the future".into());
        assert_eq!(e.native_code(), 42);
        assert!(e.to_string().contains("unknown error kind 999"));
        assert!(e.to_string().contains("from the future"));
    }

    #[test]
    fn context_keeps_kind() {
        let e = Error::NotFound("kernel 'x'".into()).context("image a.so");
        assert!(matches!(e, Error::NotFound(ref m) if m == "image a.so: kernel 'x'"));
    }
}
