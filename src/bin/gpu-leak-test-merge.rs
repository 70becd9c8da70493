//! `gpu-leak-test-merge OUT DIR...`: merges the report folders of several
//! runners (nextest partitions) into OUT, with one index.
fn main() {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let Some((out, inputs)) = args.split_first().filter(|(_, inputs)| !inputs.is_empty()) else {
        eprintln!("usage: gpu-leak-test-merge OUT DIR...\n  merges the report folders DIR... (each a runner's target/gpu-leak-test) into OUT");
        std::process::exit(2);
    };
    match gpu_leak_test::report::index::merge_report_dirs(out, inputs) {
        Ok(rows) => println!("gpu-leak-test-merge: {rows} reports of the merged run in {}", out.join("index.html").display()),
        Err(why) => {
            eprintln!("gpu-leak-test-merge: {why}");
            std::process::exit(1);
        }
    }
}
