//! The shell-less test program of `tests/it/static_binary.rs`: prints `WORKER_ID=<value>` and
//! its arguments, exits 0. Compiled by the test with `rustc -C target-feature=+crt-static`, so
//! it needs no libc in the bare root folder it runs in.

fn main() {
    let id = std::env::var("WORKER_ID").unwrap_or_else(|_| "<unset>".into());
    println!("WORKER_ID={id}");
    println!("args={:?}", std::env::args().skip(1).collect::<Vec<_>>());
}
