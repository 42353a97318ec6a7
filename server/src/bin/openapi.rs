//! Prints the REST API's OpenAPI document, generated from the code:
//!
//! ```text
//! cargo run -p belfry-server --bin belfry-openapi > server/openapi.json
//! ```

fn main() {
    print!("{}", belfry_server::api::doc::document());
}
