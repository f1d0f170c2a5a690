//! Shared-memory segments: files in a directory of this host's memory (`/dev/shm`) mapped
//! by two ranks. The creator makes a private file under a random name and writes a random
//! nonce into it; the other rank opens it by that name only (in its own directory, never by
//! a path the peer gives), checks that it is a private file of this user and not a link,
//! and checks the nonce.

use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

/// A mapped segment, unmapped on drop.
pub(crate) struct Segment {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

impl Segment {
    /// The first byte of the mapping.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Private anonymous memory of `len` bytes (zeroed), for a window nobody shares.
    pub(crate) fn anonymous(len: usize) -> io::Result<Self> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty segment"))?;
        // SAFETY: a fresh private anonymous mapping; nothing else aliases it.
        #[allow(unsafe_code)]
        let p = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        Ok(Self { ptr: p.cast(), len })
    }

    fn map(file: &File, len: usize) -> io::Result<Self> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty segment"))?;
        // SAFETY: a fresh shared mapping of a file we hold open, `len` bytes long (the
        // caller sized or checked the file); nothing else in this process aliases it.
        #[allow(unsafe_code)]
        let p = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file,
                0,
            )
        }?;
        Ok(Self { ptr: p.cast(), len })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no reference into the mapping
        // outlives the link that owns this segment.
        #[allow(unsafe_code)]
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Segment names: this prefix and 32 lowercase hex digits, random and unrelated to the
/// nonce. A peer names a segment only this way; the path is always the opener's own
/// directory joined with a name that passed [`valid_name`].
const NAME_PREFIX: &str = "monel-";

/// True for a name [`create_sized`] could have made (no `/`, no `..`, nothing else).
pub(crate) fn valid_name(name: &[u8]) -> bool {
    name.len() == NAME_PREFIX.len() + 32
        && name.starts_with(NAME_PREFIX.as_bytes())
        && name[NAME_PREFIX.len()..]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// A segment made by [`create_sized`]: its name, its path, the mapping and its nonce.
pub(crate) type Created = (String, PathBuf, Segment, [u8; 16]);

/// Creates a file of `len` bytes in `dir` under a random name (mode 0600), maps it shared
/// and writes a random nonce into its first 16 bytes (the rest of that page is the
/// caller's header space). The caller offers the name and nonce, then unlinks the file.
pub(crate) fn create_sized(dir: &Path, len: usize) -> io::Result<Created> {
    let mut nonce = [0u8; 16];
    let mut random = [0u8; 16];
    for b in [&mut nonce, &mut random] {
        getrandom::getrandom(b).map_err(|e| io::Error::other(e.to_string()))?;
    }
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{NAME_PREFIX}{hex}");
    let path = dir.join(&name);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let made = (|| {
        // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS later.
        nix::fcntl::posix_fallocate(&file, 0, len as i64)?;
        let seg = Segment::map(&file, len)?;
        // SAFETY: the header page is inside the fresh mapping, which nobody else has yet.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(nonce.as_ptr(), seg.ptr.as_ptr(), nonce.len());
        }
        Ok::<_, io::Error>(seg)
    })();
    match made {
        Ok(seg) => Ok((name, path, seg, nonce)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Maps the file named `name` in this rank's own `dir`, which another rank made with
/// [`create_sized`], if it is what such a file is: a valid name (never a path), not a
/// symbolic link, a regular file owned by this user and closed to everyone else, `len`
/// bytes long, holding `nonce` (proof that both ranks see the same memory).
pub(crate) fn open_named(
    dir: &Path,
    name: &[u8],
    len: usize,
    nonce: &[u8],
) -> Result<Segment, String> {
    use std::os::unix::fs::MetadataExt;
    if !valid_name(name) {
        return Err("the offered segment name is not one Monel makes".into());
    }
    let path = dir.join(String::from_utf8_lossy(name).as_ref());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("cannot open the peer's segment ({e}): another host?"))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err("the peer's segment is not a private file of this user".into());
    }
    if meta.len() != len as u64 {
        return Err(format!("segment is {} bytes, expected {len}", meta.len()));
    }
    let seg = Segment::map(&file, len).map_err(|e| format!("mmap: {e}"))?;
    let mut got = [0u8; 16];
    // SAFETY: the header page is inside the mapping; the creator wrote it before offering.
    #[allow(unsafe_code)]
    unsafe {
        std::ptr::copy_nonoverlapping(seg.ptr.as_ptr(), got.as_mut_ptr(), got.len());
    }
    if got[..] != *nonce {
        return Err("the segment holds another nonce: same name, different host".into());
    }
    Ok(seg)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// A directory of its own under the system's temporary one.
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("monel-shm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_peer_cannot_point_a_rank_at_a_path_of_its_choosing() {
        let dir = scratch("names");
        let len = 3 * PAGE;
        // A victim file outside the segment directory, and a link to it under a valid name.
        let victim = dir.join("victim");
        std::fs::write(&victim, vec![b'v'; len]).unwrap();
        let link = format!("{NAME_PREFIX}{}", "0123456789abcdef".repeat(2));
        std::os::unix::fs::symlink(&victim, dir.join(&link)).unwrap();
        let nonce = [7u8; 16];
        for name in [
            "../victim".as_bytes(),
            b"/etc/passwd",
            b"monel-0123",
            b"monel-0123456789abcdef0123456789ABCDEF",
            b"victim",
        ] {
            let e = open_named(&dir, name, len, &nonce).err().expect("refused");
            assert!(e.contains("not one Monel makes"), "{e}");
        }
        let e = open_named(&dir, link.as_bytes(), len, &nonce)
            .err()
            .expect("refused");
        assert!(
            e.contains("cannot open"),
            "a symbolic link is not followed: {e}"
        );
        // A file others may read is not a segment either.
        let open_to_all = format!("{NAME_PREFIX}{}", "a".repeat(32));
        std::fs::write(dir.join(&open_to_all), vec![0u8; len]).unwrap();
        std::fs::set_permissions(
            dir.join(&open_to_all),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        let e = open_named(&dir, open_to_all.as_bytes(), len, &nonce)
            .err()
            .expect("refused");
        assert!(e.contains("private file"), "{e}");
        // The victim was never written, and a real segment still opens.
        assert!(std::fs::read(&victim).unwrap().iter().all(|&b| b == b'v'));
        let (name, _, _, nonce) = create_sized(&dir, len).unwrap();
        assert!(valid_name(name.as_bytes()), "{name}");
        open_named(&dir, name.as_bytes(), len, &nonce).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
