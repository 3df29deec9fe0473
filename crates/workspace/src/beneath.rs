//! Filesystem primitives that stay inside the workspace root.
//!
//! Every path handed to these functions has already passed the bundle path
//! rules, so it is relative, has no `.`, `..` or empty segment and no NUL.
//! A directory is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//! | RESOLVE_NO_MAGICLINKS)` relative to the root's descriptor, and the last
//! segment is then only ever used as a single name relative to that
//! directory's descriptor, with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`. When the
//! kernel has no `openat2` (before Linux 5.6, or a seccomp filter hides it),
//! directories are opened one segment at a time with `O_NOFOLLOW`, which is
//! equally strict.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{
    AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat, fchmod, fstat, mkdirat, openat,
    openat2, renameat, statat, unlinkat,
};
use rustix::io::Errno;

/// Set once `openat2` turned out to be unavailable.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
/// Makes temporary names unique within this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The deepest directory nesting any walk or removal descends into.
pub(crate) const MAX_DEPTH: usize = 128;

const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Splits a validated path into its parent directory (`"."` for the root)
/// and its last segment.
pub(crate) fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", path),
    }
}

/// Opens the directory `dir` (a validated relative path, or `"."`) under
/// `root` without following any symbolic link. A symbolic link anywhere on
/// the way fails with `ELOOP`, a file on the way with `ENOTDIR`.
pub(crate) fn open_dir(root: BorrowedFd<'_>, dir: &str) -> Result<OwnedFd, Errno> {
    match open_dir_raw(root, dir) {
        // The kernel reports a link as the last segment, refused by
        // `O_NOFOLLOW | O_DIRECTORY`, as `ENOTDIR`; tell it apart.
        Err(Errno::NOTDIR) => Err(classify_not_dir(root, dir)),
        result => result,
    }
}

/// Finds the first segment of `dir` that is not a directory: `ELOOP` when
/// it is a symbolic link, `ENOTDIR` otherwise.
fn classify_not_dir(root: BorrowedFd<'_>, dir: &str) -> Errno {
    let mut current = match openat(root, ".", DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(error) => return error,
    };
    for segment in dir.split('/') {
        match lstat_at(current.as_fd(), segment) {
            Ok(Some(stat)) if file_type(&stat) == FileType::Symlink => return Errno::LOOP,
            Ok(Some(stat)) if file_type(&stat) == FileType::Directory => {}
            Ok(_) => return Errno::NOTDIR,
            Err(error) => return error,
        }
        current = match openat(&current, segment, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOTDIR) => return Errno::NOTDIR,
            Err(error) => return error,
        };
    }
    Errno::NOTDIR
}

fn open_dir_raw(root: BorrowedFd<'_>, dir: &str) -> Result<OwnedFd, Errno> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match openat2(root, dir, DIR_FLAGS, Mode::empty(), resolve) {
            Err(Errno::NOSYS) | Err(Errno::PERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
            result => return result,
        }
    }
    open_dir_by_segments(root, dir)
}

/// The fallback of [`open_dir`] without `openat2`: one segment at a time,
/// each opened with `O_NOFOLLOW` relative to the previous one.
fn open_dir_by_segments(root: BorrowedFd<'_>, dir: &str) -> Result<OwnedFd, Errno> {
    let mut current = openat(root, ".", DIR_FLAGS, Mode::empty())?;
    if dir == "." {
        return Ok(current);
    }
    for segment in dir.split('/') {
        current = openat(&current, segment, DIR_FLAGS, Mode::empty())?;
    }
    Ok(current)
}

/// Opens `dir` like [`open_dir`], creating the directories that are missing
/// (mode `0o755` before the umask). An existing symbolic link or file on the
/// way fails with `ELOOP` or `ENOTDIR`.
pub(crate) fn create_dir_all(root: BorrowedFd<'_>, dir: &str) -> Result<OwnedFd, Errno> {
    match open_dir(root, dir) {
        Err(Errno::NOENT) => {}
        result => return result,
    }
    let mut current = openat(root, ".", DIR_FLAGS, Mode::empty())?;
    for segment in dir.split('/') {
        current = match openat(&current, segment, DIR_FLAGS, Mode::empty()) {
            Err(Errno::NOENT) => {
                match mkdirat(&current, segment, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(error) => return Err(error),
                }
                openat(&current, segment, DIR_FLAGS, Mode::empty())?
            }
            Err(Errno::NOTDIR) => match lstat_at(current.as_fd(), segment)? {
                Some(stat) if file_type(&stat) == FileType::Symlink => return Err(Errno::LOOP),
                _ => return Err(Errno::NOTDIR),
            },
            result => result?,
        };
    }
    Ok(current)
}

/// `lstat` of one name in `dir`; `None` when nothing is there.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &str) -> Result<Option<Stat>, Errno> {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(error) => Err(error),
    }
}

pub(crate) fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// Why a name cannot be opened as a regular file.
pub(crate) enum OpenFileError {
    Missing,
    Symlink,
    NotRegular,
    Os(Errno),
}

impl From<Errno> for OpenFileError {
    fn from(error: Errno) -> Self {
        match error {
            Errno::NOENT => OpenFileError::Missing,
            Errno::LOOP => OpenFileError::Symlink,
            error => OpenFileError::Os(error),
        }
    }
}

/// Opens one name in `dir` for reading, only if it is a regular file.
///
/// The name is checked with `lstat` before it is opened, so a FIFO or a
/// device is never opened at all; the open itself uses `O_NONBLOCK` and
/// `O_NOFOLLOW` and the result is checked again with `fstat` against the
/// first look, in case the workload swapped the entry in between.
pub(crate) fn open_regular(dir: BorrowedFd<'_>, name: &str) -> Result<(File, Stat), OpenFileError> {
    let first = lstat_at(dir, name)?.ok_or(OpenFileError::Missing)?;
    match file_type(&first) {
        FileType::RegularFile => {}
        FileType::Symlink => return Err(OpenFileError::Symlink),
        _ => return Err(OpenFileError::NotRegular),
    }
    let flags =
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty())?;
    let second = fstat(&fd)?;
    if file_type(&second) != FileType::RegularFile
        || second.st_ino != first.st_ino
        || second.st_dev != first.st_dev
    {
        return Err(OpenFileError::NotRegular);
    }
    Ok((File::from(fd), second))
}

/// The size `stat` reports, as an unsigned number.
pub(crate) fn size_of(stat: &Stat) -> u64 {
    u64::try_from(stat.st_size).unwrap_or(0)
}

/// Reads at most `max + 1` bytes, so a caller can tell a file that grew past
/// `max` since it was measured.
pub(crate) fn read_bounded(file: &mut File, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes `bytes` as `name` in `dir` atomically: a new temporary file in the
/// same directory, then a rename over the name. A symbolic link at the name
/// is replaced, never followed. An existing regular file's permission bits
/// are kept.
pub(crate) fn write_atomic(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let existing_mode = match lstat_at(dir, name)? {
        Some(stat) if file_type(&stat) == FileType::RegularFile => Some(stat.st_mode & 0o7777),
        _ => None,
    };
    let temp = format!(
        ".telo-write-{}-{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::EXCL
        | OFlags::NOFOLLOW
        | OFlags::NOCTTY
        | OFlags::CLOEXEC;
    let fd = openat(dir, temp.as_str(), flags, Mode::from_raw_mode(0o644))?;
    let result = (|| -> std::io::Result<()> {
        if let Some(mode) = existing_mode {
            fchmod(&fd, Mode::from_raw_mode(mode))?;
        }
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        drop(file);
        renameat(dir, temp.as_str(), dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = unlinkat(dir, temp.as_str(), AtFlags::empty());
    }
    result
}

/// Why a removal stopped.
pub(crate) enum RemoveError {
    /// The directory nests deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A directory kept refilling as fast as it was emptied.
    Endless,
    Os(Errno),
}

impl From<Errno> for RemoveError {
    fn from(error: Errno) -> Self {
        RemoveError::Os(error)
    }
}

/// Removes one name in `dir`: a file, link, FIFO or socket is unlinked, a
/// directory is emptied without following any link in it and then removed.
/// Returns `false` when nothing was there.
pub(crate) fn remove(dir: BorrowedFd<'_>, name: &str) -> Result<bool, RemoveError> {
    let Some(stat) = lstat_at(dir, name)? else {
        return Ok(false);
    };
    if file_type(&stat) == FileType::Directory {
        let name = CString::new(name).map_err(|_| Errno::INVAL)?;
        remove_dir_all(dir, &name, 0)?;
    } else {
        match unlinkat(dir, name, AtFlags::empty()) {
            Err(Errno::NOENT) => return Ok(false),
            result => result?,
        }
    }
    Ok(true)
}

/// How many names a removal reads before deleting them and reading again,
/// which keeps its memory bounded however large the directory is.
const REMOVE_BATCH: usize = 1024;
/// How many batches one directory may take (ten million names), so a
/// workload refilling a directory cannot keep a removal going forever.
const REMOVE_MAX_BATCHES: usize = 10_000;

fn remove_dir_all(parent: BorrowedFd<'_>, name: &CStr, depth: usize) -> Result<(), RemoveError> {
    if depth >= MAX_DEPTH {
        return Err(RemoveError::TooDeep);
    }
    let fd = openat(parent, name, DIR_FLAGS, Mode::empty())?;
    let mut entries = Dir::new(fd)?;
    let mut batches = 0;
    loop {
        let mut batch: Vec<CString> = Vec::new();
        while batch.len() < REMOVE_BATCH {
            let Some(entry) = entries.read() else { break };
            let entry = entry?;
            let entry_name = entry.file_name();
            if entry_name.to_bytes() == b"." || entry_name.to_bytes() == b".." {
                continue;
            }
            batch.push(entry_name.to_owned());
        }
        if batch.is_empty() {
            break;
        }
        batches += 1;
        if batches > REMOVE_MAX_BATCHES {
            return Err(RemoveError::Endless);
        }
        let here = entries.fd()?;
        for entry_name in &batch {
            let stat = match statat(here, entry_name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(error) => return Err(error.into()),
            };
            if file_type(&stat) == FileType::Directory {
                remove_dir_all(here, entry_name, depth + 1)?;
            } else {
                match unlinkat(here, entry_name.as_c_str(), AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
        entries.rewind();
    }
    drop(entries);
    Ok(unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn the_fallback_without_openat2_refuses_links_and_files_on_the_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root_path = dir.path().join("root");
        std::fs::create_dir_all(root_path.join("a/b")).expect("mkdir");
        std::fs::write(root_path.join("file"), b"1").expect("write");
        symlink(dir.path(), root_path.join("link")).expect("symlink");
        symlink("..", root_path.join("a/up")).expect("symlink");
        let root = rustix::fs::open(&root_path, DIR_FLAGS, Mode::empty()).expect("open");
        let root = root.as_fd();

        assert!(open_dir_by_segments(root, ".").is_ok());
        assert!(open_dir_by_segments(root, "a/b").is_ok());
        for path in ["link", "link/root", "a/up", "a/up/a"] {
            let error = open_dir_by_segments(root, path).expect_err(path);
            assert!(
                matches!(error, Errno::NOTDIR | Errno::LOOP),
                "{path}: {error:?}"
            );
            assert_eq!(classify_not_dir(root, path), Errno::LOOP, "{path}");
        }
        assert_eq!(
            open_dir_by_segments(root, "file").expect_err("file"),
            Errno::NOTDIR
        );
        assert_eq!(classify_not_dir(root, "file/x"), Errno::NOTDIR);
        assert_eq!(open_dir(root, "link").expect_err("link"), Errno::LOOP);
        assert_eq!(open_dir(root, "a/up/a").expect_err("link"), Errno::LOOP);
    }
}
