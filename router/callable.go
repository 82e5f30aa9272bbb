package router

import "github.com/capgate/capgate/tool"

// ChatRefusal is the chat gate's answer for c and d, decided without a
// call: nil when c's chat may call d, else the denial an invoke would get.
// capability.list uses it so that a list never offers what every call refuses.
func ChatRefusal(c *Caller, d *tool.Descriptor) error { return chatGate(c, d) }
