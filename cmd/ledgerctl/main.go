// Command ledgerctl audits and inspects an effect ledger.
package main

import (
	"fmt"
	"os"
)

const usage = `Usage: ledgerctl <command> [flags]

Commands (coming with the verifier):
  verify    check chain integrity and the key state machine
  audit     report runtime retries, re-invocations and duplicate effects
  receipts  list receipts
  show      show one key's state and receipts
  head      print the chain head
  export    print every receipt as JSON lines
  resolve   record an operator's decision about an interrupted key
`

func main() {
	fmt.Fprint(os.Stderr, usage)
	if len(os.Args) > 1 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help") {
		os.Exit(0)
	}
	os.Exit(2)
}
