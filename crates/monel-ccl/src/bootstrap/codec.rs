//! The length-prefixed fields and magics the rendezvous and the mesh read and write.

use std::io::Read;

pub(super) const MAGIC_BOOT: &[u8; 4] = b"MNL3";
pub(super) const MAGIC_HELLO: &[u8; 4] = b"MNLH";

pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u16).to_le_bytes());
    out.extend(s.as_bytes());
}

pub(super) fn get_str(s: &mut impl Read) -> std::io::Result<String> {
    let mut l = [0u8; 2];
    s.read_exact(&mut l)?;
    let mut b = vec![0u8; u16::from_le_bytes(l) as usize];
    s.read_exact(&mut b)?;
    String::from_utf8(b).map_err(|_| std::io::ErrorKind::InvalidData.into())
}

pub(super) fn get_u32(s: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(super) fn read_array<const N: usize>(s: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

pub(super) fn expect_magic(s: &mut impl Read, magic: &[u8; 4], what: &str) -> std::io::Result<()> {
    if &read_array::<4>(s)? != magic {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a Monel {what}"),
        ));
    }
    Ok(())
}
