// Package goclient tests the Go client module (client/, a module of its
// own) against a real gateway-agent and redis-server: what its own tests,
// which link nothing of the agent, can only fake. The root module requires
// the client module for these tests alone (replaced by ./client).
package goclient
