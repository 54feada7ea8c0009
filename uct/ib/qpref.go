package ib

import "fmt"

// TestingQP names one endpoint's QP for the fault-injection hooks
// (TestingEndpointQPs, TestingForceQPError): QP numbers are per device.
type TestingQP struct {
	Device string // RDMA device ("rxe0")
	QPN    uint32
}

func (q TestingQP) String() string { return fmt.Sprintf("%s/%#x", q.Device, q.QPN) }
