fn main() {
    let cfg = rebound::config::load(std::path::Path::new(&std::env::args().nth(1).unwrap()));
    println!("{cfg:?}");
}
