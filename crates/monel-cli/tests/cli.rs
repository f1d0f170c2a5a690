//! The `monel` binary, run as a user would.

use std::process::Command;

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../monel-wire/tests/data/rxe-pingpong.pcap"
);

fn monel(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn dump_checks_every_icrc_of_the_rxe_capture() {
    let (code, out) = monel(&["dump", CAPTURE]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1013 records, 1000 RoCEv2 packets, 0 bad ICRC, 0 malformed"),
        "{out}"
    );
    assert!(
        out.contains("10.77.0.3 > 10.77.0.2 RC_SEND_FIRST qp=0x000011"),
        "{out}"
    );
}

#[test]
fn dump_reports_a_corrupted_packet_and_fails() {
    let mut bytes = std::fs::read(CAPTURE).unwrap();
    // Flip one payload byte of some packet deep in the file (inside a 1024-byte SEND payload).
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    let path = std::env::temp_dir().join(format!("monel-cli-{}.pcap", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let (code, out) = monel(&["dump", "-q", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 bad ICRC") || out.contains("1 malformed"),
        "{out}"
    );
}

#[test]
fn dump_of_a_missing_or_bad_file_is_a_clear_error() {
    let (code, out) = monel(&["dump", "/nonexistent/x.pcap"]);
    assert_ne!(code, 0);
    assert!(out.contains("reading /nonexistent/x.pcap"), "{out}");
    let path = std::env::temp_dir().join(format!("monel-cli-bad-{}.pcap", std::process::id()));
    std::fs::write(&path, b"not a pcap file at all, sorry").unwrap();
    let (code, out) = monel(&["dump", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_ne!(code, 0);
    assert!(out.contains("malformed pcap data"), "{out}");
}

#[test]
fn sim_prints_the_loss_table() {
    let (code, out) = monel(&["sim", "--ops", "40", "--loss", "0,5"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("loss%"), "{out}");
    assert!(out.contains("   0.0       160"), "{out}");
    assert!(out.contains("   5.0       160"), "{out}");
    let (code, out) = monel(&["sim", "--loss", "150"]);
    assert_ne!(code, 0);
    assert!(out.contains("loss rates are percentages"), "{out}");
}
