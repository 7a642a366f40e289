// Gloo's TCP transport publishes each pair's address as the raw bytes of its
// tcp::Address::Impl (a sockaddr_storage and a sequence number), filled by getsockname() into
// a structure it never cleared: past the address family's own length those bytes are whatever
// was on the stack (heap and stack pointers of the daemon). Before such a value leaves the
// daemon for the rendezvous store, those bytes are zeroed; what Gloo reads back (family, port,
// address, sequence number) is unchanged.
#pragma once

#include <cstddef>
#include <vector>

namespace gradsync::gloo_engine {

// The size of one published TCP address (tcp::Address::Impl).
size_t tcp_address_bytes();

// Zeroes the bytes of every address in `value` (a concatenation of TCP addresses, as Gloo's
// createAndConnectAllPairs publishes) that the address family does not use. A value that is
// not such a concatenation is left alone; returns whether it was one.
bool scrub_tcp_addresses(std::vector<char>* value);

}  // namespace gradsync::gloo_engine
