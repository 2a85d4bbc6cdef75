package exchange

// PumpErrorOr returns the error an exchange whose upstream read failed
// with err ends with: the request body pump's (*pump: its result; nil:
// none runs), when it has failed already, since the client's fault
// caused the upstream's, or err. A result it takes is taken for good:
// *pump becomes nil.
func PumpErrorOr(pump *chan error, err error) error {
	if *pump == nil {
		return err
	}
	select {
	case perr := <-*pump:
		*pump = nil
		if perr != nil {
			return perr
		}
	default:
	}
	return err
}
