//! Fuzzes GetFlightInfo command decoding (`FlightRequest{tensor_read}`): no input may panic;
//! an accepted command re-encodes to one that decodes to the same read request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_proto::ticket::{decode_flight_request, flight_request};

fuzz_target!(|data: &[u8]| {
    if let Ok(read) = decode_flight_request(data) {
        let again = decode_flight_request(&flight_request(read.clone())).map_err(|e| e.to_string());
        assert_eq!(again, Ok(read));
    }
});
