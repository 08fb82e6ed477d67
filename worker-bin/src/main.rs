//! `tranche`: plans ID ranges, runs them on a fleet of workers through Redis (or
//! embedded in this process), archives what finished and answers for it for ever. The
//! whole program is the library's [`tranche_worker::cli_main`].

fn main() -> std::process::ExitCode {
    tranche_worker::cli_main()
}
