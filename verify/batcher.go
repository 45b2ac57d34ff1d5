package verify

import (
	"github.com/effect-ledger/effect-ledger/chain"
)

// batcher hands receipts, in order and in batches, to a pipeline of
// stages, each on a goroutine of its own: every stage sees every receipt,
// in order, after the stage before it. The receipts' strings are shared,
// not copied: the sources allocate them per receipt.
type batcher struct {
	cur  []chain.Receipt
	in   chan []chain.Receipt
	free chan []chain.Receipt
	done chan struct{}
}

const (
	batchReceipts = 256
	batchesAhead  = 4
)

func newBatcher(stages ...func(*chain.Receipt)) *batcher {
	n := batchesAhead * (len(stages) + 1)
	b := &batcher{in: make(chan []chain.Receipt, batchesAhead), free: make(chan []chain.Receipt, n), done: make(chan struct{})}
	for range n {
		b.free <- make([]chain.Receipt, 0, batchReceipts)
	}
	b.cur = <-b.free
	in := b.in
	for i, fn := range stages {
		out := make(chan []chain.Receipt, batchesAhead)
		last := i == len(stages)-1
		go func(in <-chan []chain.Receipt) {
			defer close(out)
			for batch := range in {
				for j := range batch {
					fn(&batch[j])
				}
				if !last {
					out <- batch
					continue
				}
				clear(batch) // drop the strings
				b.free <- batch[:0]
			}
		}(in)
		in = out
	}
	go func() {
		for range in { // the last stage's output channel only closes
		}
		close(b.done)
	}()
	return b
}

func (b *batcher) add(r *chain.Receipt) {
	if b.cur = append(b.cur, *r); len(b.cur) == batchReceipts {
		b.in <- b.cur
		b.cur = <-b.free
	}
}

// close hands on the last batch and waits until every stage has seen
// every receipt.
func (b *batcher) close() {
	if len(b.cur) > 0 {
		b.in <- b.cur
	}
	close(b.in)
	<-b.done
}
