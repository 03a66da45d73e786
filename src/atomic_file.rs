//! Files that readers see whole or not at all: a temporary file in the same
//! folder, fsync, rename. Used for the ID and state files and by `install`.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Writes `contents` to `path` so that readers see the old file or the new
/// one, never a torn or empty one: a temporary file in the same folder,
/// fsync, rename over `path`.
///
/// Errors: any I/O error; `path` is then unchanged.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    // 0644: the app container may run as another user than the sidecar.
    write_atomic_from(path, 0o644, &mut &contents[..])
}

/// [`write_atomic`] with the file mode and the contents from a reader.
///
/// Errors: any I/O error; `path` is then unchanged.
pub fn write_atomic_from(path: &Path, mode: u32, contents: &mut impl Read) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".snowlease-")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    // The mode given at creation is masked by the umask (077 would make
    // the file unreadable to an app running as another user): set it again.
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    std::io::copy(contents, &mut tmp)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Creates `dir` and its missing parents with mode 0755 whatever the umask
/// (the app container may run as another user and must reach the files);
/// folders that already exist keep their mode.
///
/// Errors: the first I/O error.
pub fn create_dir_all_readable(dir: &Path) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all_readable(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)),
        // Created meanwhile by someone else: theirs to set.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-id");
        write_atomic(&path, b"7\n").unwrap();
        write_atomic(&path, b"12\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"12\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
