//! Files that readers see whole or not at all: a temporary file in the same
//! folder, fsync, rename. Used for the ID and state files (through a kept
//! open `Folder`) and by `install`.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, Stat};

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
pub(crate) fn write_atomic_from(
    path: &Path,
    mode: u32,
    contents: &mut impl Read,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    Folder::open(dir)?.write_atomic(name, mode, contents)?;
    Ok(())
}

/// A folder kept open, whose files are written, checked and removed by
/// name relative to it (openat, renameat, unlinkat): a write then needs one
/// new descriptor, for the temporary file, and a check or a removal none.
/// The sidecar's ID and state files are written this way, so a process
/// short of descriptors (a flood of HTTP connections) still keeps them fresh.
#[derive(Debug)]
pub(crate) struct Folder {
    fd: OwnedFd,
    path: PathBuf,
}

/// What tells one version of a file from another without reading it:
/// device, inode, size and modification time. A rename over the file gives
/// another inode; an edit in place another mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime_ns: i128,
}

impl Stamp {
    // The field types of `struct stat` differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    fn of(stat: &Stat) -> Self {
        Self {
            dev: stat.st_dev as u64,
            ino: stat.st_ino as u64,
            size: stat.st_size as i64,
            mtime_ns: i128::from(stat.st_mtime as i64) * 1_000_000_000
                + i128::from(stat.st_mtime_nsec as u32),
        }
    }
}

impl Folder {
    /// Opens the folder `path` (which must exist) and keeps it open.
    ///
    /// Errors: the open error (not found, not a folder, no permission).
    pub(crate) fn open(path: &Path) -> std::io::Result<Self> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    /// The path the folder was opened at (for messages).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to the file `name` in this folder so that readers
    /// see the old file or the new one, never a torn or empty one: a
    /// temporary file beside it with `mode` (whatever the umask), fsync,
    /// rename over `name`. Returns the new file's [`Stamp`].
    ///
    /// Errors: any I/O error; the file is then unchanged and no temporary
    /// file is left.
    pub(crate) fn write_atomic(
        &self,
        name: &OsStr,
        mode: u32,
        contents: &mut impl Read,
    ) -> std::io::Result<Stamp> {
        let temporary = format!(".snowlease-{:016x}", rand::random::<u64>());
        let fd = rustix::fs::openat(
            &self.fd,
            temporary.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        let written = fill(File::from(fd), mode, contents).and_then(|stamp| {
            rustix::fs::renameat(&self.fd, temporary.as_str(), &self.fd, name)?;
            Ok(stamp)
        });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, temporary.as_str(), AtFlags::empty());
        }
        written
    }

    /// The [`Stamp`] of the file `name` (a symlink's own, not its target's).
    ///
    /// Errors: the stat error (`NotFound` when there is no such file).
    pub(crate) fn stamp(&self, name: &OsStr) -> std::io::Result<Stamp> {
        let stat = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(Stamp::of(&stat))
    }

    /// Removes the file `name`.
    ///
    /// Errors: the unlink error (`NotFound` when there is no such file).
    pub(crate) fn remove(&self, name: &OsStr) -> std::io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }
}

/// Fills a new temporary file: mode, contents, fsync; its stamp then.
fn fill(mut file: File, mode: u32, contents: &mut impl Read) -> std::io::Result<Stamp> {
    // The mode given at creation is masked by the umask (077 would make
    // the file unreadable to an app running as another user): set it again.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    std::io::copy(contents, &mut file)?;
    file.flush()?;
    file.sync_all()?;
    Ok(Stamp::of(&rustix::fs::fstat(&file)?))
}

/// Creates `dir` and its missing parents with mode 0755 whatever the umask
/// (the app container may run as another user and must reach the files);
/// folders that already exist keep their mode.
///
/// Errors: the first I/O error.
pub(crate) fn create_dir_all_readable(dir: &Path) -> std::io::Result<()> {
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

    #[test]
    fn stamp_changes_with_every_write_and_an_edit_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::open(dir.path()).unwrap();
        let name = OsStr::new("worker-id");
        let first = folder.write_atomic(name, 0o644, &mut &b"7\n"[..]).unwrap();
        assert_eq!(folder.stamp(name).unwrap(), first);
        let second = folder.write_atomic(name, 0o644, &mut &b"7\n"[..]).unwrap();
        assert_ne!(first, second, "a rewrite is another inode");
        std::fs::write(dir.path().join(name), b"12\n").unwrap();
        assert_ne!(folder.stamp(name).unwrap(), second, "an edit in place");
        let mode = std::fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        folder.remove(name).unwrap();
        assert_eq!(
            folder.stamp(name).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
