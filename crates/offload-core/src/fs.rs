//! Reading files named by users: only regular files, opened without blocking (a FIFO or a
//! device file named as an image would otherwise hang the process or read without end), into
//! memory allocated fallibly (a huge file is an out-of-memory error, not an abort); and the
//! process's own files: sealed memory files, the directory of the running library.

use crate::error::{Error, Result};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a non-regular file is, for messages.
pub fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Reads the regular file at `path` (`what` names it in errors: `image`, `--arg 3 file=`).
/// Anything else (directory, FIFO, socket, device) is refused before it is read, without
/// blocking.
pub fn read_regular(path: &Path, what: &str) -> Result<Vec<u8>> {
    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::InvalidArgument(format!("cannot read {what} '{shown}': {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::InvalidArgument(format!("cannot read {what} '{shown}': {e}")))?;
    if !meta.file_type().is_file() {
        return Err(Error::InvalidArgument(format!(
            "{what} '{shown}' is {}, not a regular file",
            kind_of(meta.file_type())
        )));
    }
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|_| {
        Error::OutOfMemory(format!(
            "{what} '{shown}' has {} bytes, more than this process can hold",
            meta.len()
        ))
    })?;
    (&file)
        .take(meta.len())
        .read_to_end(&mut bytes)
        .map_err(|e| Error::InvalidArgument(format!("cannot read {what} '{shown}': {e}")))?;
    Ok(bytes)
}

/// An anonymous memory file (`memfd_create`, close-on-exec) named `name` holding `bytes`,
/// sealed against writes and resizing, for handing bytes to the dynamic loader or a child
/// process as `/proc/self/fd/N` without a file on disk. `what` names the bytes in errors.
pub fn sealed_memfd(
    name: &std::ffi::CStr,
    bytes: &[u8],
    what: &str,
) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a valid C string; flags are defined by the kernel ABI.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(Error::System(format!(
            "memfd_create for {what}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, bytes)
        .map_err(|e| Error::System(format!("writing {what} to a memory file: {e}")))?;
    let fd = OwnedFd::from(file);
    // SAFETY: plain fcntl on our descriptor; sealing is best effort (nothing else holds it).
    unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        );
    }
    Ok(fd)
}

/// The directory of the shared library (or executable) this function is linked into, as the
/// dynamic loader recorded it, made absolute. Every library that links `offload-core` has its
/// own copy of this code (Rust functions are not exported from a cdylib), so the address
/// names the caller's own library: a plugin's, the drop-in libomptarget's. `None` if the loader
/// does not say.
pub fn this_library_dir() -> Option<std::path::PathBuf> {
    let file = loaded_file_of(this_library_dir as *const () as usize)?;
    let file = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(file.to_bytes()));
    let file = std::path::absolute(&file).unwrap_or(file);
    file.parent().map(Path::to_path_buf)
}

/// The directory of the running executable, if the system says.
pub fn exe_dir() -> Option<std::path::PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// The directories of `PATH`, in order: the absolute ones only (a relative entry would find
/// tools by the current directory, which a caller does not choose).
pub fn path_dirs() -> Vec<std::path::PathBuf> {
    crate::env::os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default()
}

/// The file name, as the dynamic loader recorded it (`dladdr`), of the loaded object (shared
/// library or executable) whose mapping holds the address `addr`; `None` where no loaded
/// object holds it or the loader records no name. Any address may be asked about: nothing is
/// read at `addr`.
pub fn loaded_file_of(addr: usize) -> Option<std::ffi::CString> {
    // SAFETY: `Dl_info` is plain data; all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables (the address is compared, never read);
    // `info` is a live out-value.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: the loader's NUL-terminated file name, alive while the object is loaded; copied.
    Some(unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_owned())
}

/// The machine's physical memory in bytes (0 if the system does not say).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        0
    }
}

/// `len` zero bytes, or an out-of-memory error naming `what` (also when `len` is more than
/// the machine's physical memory).
pub fn try_zeroed(len: usize, what: &str) -> Result<Vec<u8>> {
    // More than the machine has would be granted on paper (overcommit) and then end the
    // process when it is written.
    let physical = physical_memory();
    if physical > 0 && len as u64 > physical {
        return Err(Error::OutOfMemory(format!(
            "{what}: {len} bytes is more than this machine's {physical} bytes of memory"
        )));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::OutOfMemory(format!("{what}: cannot allocate {len} bytes on the host"))
    })?;
    v.resize(len, 0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read_and_fifos_do_not_block() {
        let dir = std::env::temp_dir().join(format!("offload-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file, "image").unwrap(), b"abc");
        let e = read_regular(&dir, "image").unwrap_err().to_string();
        assert!(e.contains("is a directory, not a regular file"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&fifo, "image").unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), "--arg 1 file=")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a character device"), "{e}");
        let e = try_zeroed(usize::MAX, "buffer").unwrap_err().to_string();
        assert!(e.starts_with("out of memory: buffer: "), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
