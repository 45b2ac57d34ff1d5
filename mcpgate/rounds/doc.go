// Package rounds is the MCP gateway's extension for calls of more than
// one round (SPEC §11.1, multi round-trip requests): the requestState
// envelope that makes a call's rounds one execution (Seal, Open, and the
// state key that authenticates it), the asking of a client of a revision
// before 2026-07-28 on the upstream's behalf (Fulfil), and parked calls
// (Parking): a 2026-07-28 client's call to an older upstream, whose
// requests during the call become the client's rounds.
//
// The extension keeps its own state (Parking: the parked calls of this
// process and the parking peers) and reaches the gateway through values:
// a Round (the reservation a round runs under, and how its call's final
// answer is committed should no round come), the peers of package
// serverreq, and the raw slots of package wire.
package rounds
