module github.com/effect-ledger/effect-ledger/client

go 1.22

require (
	github.com/gowebpki/jcs v1.0.2
	github.com/stretchr/testify v1.12.1
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
