module github.com/capgate/capgate

go 1.26

require (
	github.com/spf13/cobra v1.10.2
	go.yaml.in/yaml/v3 v3.0.6
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/pelletier/go-toml/v2 v2.4.3 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
